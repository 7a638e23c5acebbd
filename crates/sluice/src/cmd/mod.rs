//! One module per subcommand; each parses its arguments and calls a library.

pub(crate) mod analyze;
pub(crate) mod demo;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod sim;
