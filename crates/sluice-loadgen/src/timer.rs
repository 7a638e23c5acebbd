//! Waits with sub-millisecond resolution: the delay proxy's one-way delays and the open
//! loop's schedule (tokio's timer rounds every wait up to whole milliseconds, which would
//! add up to a millisecond to a latency measured from the intended send time).

use std::io;

use tokio::time::Instant;

/// Waits until a deadline with sub-millisecond resolution: a `timerfd` on Linux (tokio's
/// timer rounds up to whole milliseconds), tokio's timer elsewhere.
#[derive(Debug)]
pub(crate) struct Timer {
    #[cfg(target_os = "linux")]
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

#[cfg(target_os = "linux")]
impl Timer {
    pub(crate) fn new() -> io::Result<Self> {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // `new` is deprecated for types that could swap their descriptor; an `OwnedFd`
        // owned by the `AsyncFd` cannot, which is `register`'s (unsafe) condition, and the
        // workspace has no unsafe code.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd)?;
        Ok(Self { fd })
    }

    pub(crate) async fn sleep_until(&mut self, deadline: Instant) -> io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, timerfd_settime};
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(()); // also: a zero setting would disarm the timer, not fire it
        }
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = rustix::time::Timespec::try_from(left)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "delay too long"))?;
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        loop {
            let mut ready = self.fd.readable().await?;
            // The expiration count (8 bytes); reading it re-arms readiness for the next wait.
            let mut count = [0u8; 8];
            match rustix::io::read(self.fd.get_ref(), &mut count) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Timer {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {})
    }

    pub(crate) async fn sleep_until(&mut self, deadline: Instant) -> io::Result<()> {
        tokio::time::sleep_until(deadline).await;
        Ok(())
    }
}
