//! Waiting in tests for something to hold: poll it, give up after a limit, and fail naming
//! what was awaited, with what the caller adds to the failure (a process's log). One
//! implementation, in a blocking and an async form, for the waits that poll a condition
//! (the waits for a log line or a message read from a channel have their own).

use std::time::{Duration, Instant};

/// How often a check is repeated unless the wait says otherwise.
const DEFAULT_EVERY: Duration = Duration::from_millis(20);

/// A wait for `what`, given up after `limit`; `context` makes what a failure adds.
pub struct Wait<'a, C> {
    what: &'a str,
    limit: Duration,
    every: Duration,
    context: C,
}

impl<'a> Wait<'a, fn() -> String> {
    pub fn for_(what: &'a str, limit: Duration) -> Wait<'a, fn() -> String> {
        Wait {
            what,
            limit,
            every: DEFAULT_EVERY,
            context: String::new,
        }
    }
}

impl<'a, C: Fn() -> String> Wait<'a, C> {
    /// Check every `every` (20 ms by default).
    pub fn every(mut self, every: Duration) -> Wait<'a, C> {
        self.every = every;
        self
    }

    /// What the failure adds after its message, made when the wait gives up (a log).
    pub fn showing<D: Fn() -> String>(self, context: D) -> Wait<'a, D> {
        Wait {
            what: self.what,
            limit: self.limit,
            every: self.every,
            context,
        }
    }

    /// Blocks until `check` returns something, and returns it.
    pub fn until<T>(self, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + self.limit;
        loop {
            if let Some(found) = check() {
                return found;
            }
            self.give_up_after(deadline);
            std::thread::sleep(self.every);
        }
    }

    /// Blocks until `check` holds.
    pub fn until_true(self, mut check: impl FnMut() -> bool) {
        self.until(|| check().then_some(()))
    }

    /// Waits (on tokio's timer) until `check` returns something, and returns it.
    pub async fn eventually<T>(self, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + self.limit;
        loop {
            if let Some(found) = check() {
                return found;
            }
            self.give_up_after(deadline);
            tokio::time::sleep(self.every).await;
        }
    }

    /// Waits (on tokio's timer) until `check` holds.
    pub async fn eventually_true(self, mut check: impl FnMut() -> bool) {
        self.eventually(|| check().then_some(())).await
    }

    fn give_up_after(&self, deadline: Instant) {
        if Instant::now() < deadline {
            return;
        }
        let context = (self.context)();
        let separator = if context.is_empty() { "" } else { "\n" };
        panic!(
            "timed out after {:?} waiting for {}{separator}{context}",
            self.limit, self.what
        );
    }
}
