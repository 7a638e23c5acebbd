//! One contract for a *center* — a store that decides some rules for every node (Redis,
//! exact or batched; a token server; any future one) — and the local fallback written once
//! for all of them (seed 002 §4.4(4)).
//!
//! - [`Center`]: ask ([`Center::check`]), decide from what the node holds of the center
//!   without I/O ([`Center::held`]: a batch, a lease), and probe the center itself, charging
//!   it first with what the node admitted on its own ([`Center::probe`]). Its errors say
//!   whether the center is unreachable ([`CenterError::is_unavailable`]).
//! - [`FallbackLimiter`]: any center with a local fallback. While the center does not
//!   answer within its timeout, the node decides from its batch or lease while it is valid,
//!   then with its [`Share`] of the limit on a state that also counts what the center
//!   admitted for it ([`take_what_fits`]); one request per probe interval tries the center
//!   again, and only the center answering ends the fallback. What the share admitted is
//!   owed ([`Debt`]) and charged to the center before the node's next central decision of
//!   the key.
//! - [`ConsumptionRate`]: how fast a node uses a key's permits, to size the batch or lease
//!   it asks for next.
//!
//! Time is an argument everywhere (the caller's clock, ns): the fallback is tested on a
//! simulated clock.

mod center;
mod debt;
mod fallback;
mod rate;
mod share;
mod sweep;

pub use center::{AlgorithmId, Center, CenterError};
pub use debt::{Debt, charge_cap};
pub use fallback::{
    FallbackConfig, FallbackLimiter, FallbackStats, Mode, Outcome, Source, Transition,
};
pub use rate::ConsumptionRate;
pub use share::{Share, take_what_fits};
pub use sweep::{PRUNE_EVERY, Sweep};
