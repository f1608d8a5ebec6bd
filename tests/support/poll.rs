//! Waiting in tests for something to hold: poll it, give up after a limit, and fail naming
//! what was awaited, with what the caller adds to the failure (a process's log). The one
//! implementation, in a blocking and an async form, that every test's wait goes through.

use std::time::{Duration, Instant};

/// How often a check is repeated unless the wait says otherwise.
const DEFAULT_EVERY: Duration = Duration::from_millis(20);

/// A wait for `what`, given up after `limit`.
pub struct Wait<'a> {
    what: &'a str,
    limit: Duration,
    every: Duration,
    context: Option<Box<dyn Fn() -> String + 'a>>,
}

impl<'a> Wait<'a> {
    pub fn for_(what: &'a str, limit: Duration) -> Wait<'a> {
        Wait {
            what,
            limit,
            every: DEFAULT_EVERY,
            context: None,
        }
    }

    /// Check every `every` (20 ms by default).
    pub fn every(mut self, every: Duration) -> Wait<'a> {
        self.every = every;
        self
    }

    /// What the failure adds after its message, read when the wait gives up (a log).
    pub fn showing(mut self, context: impl Fn() -> String + 'a) -> Wait<'a> {
        self.context = Some(Box::new(context));
        self
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
        let context = self
            .context
            .as_ref()
            .map(|context| format!("\n{}", context()))
            .unwrap_or_default();
        panic!(
            "timed out after {:?} waiting for {}{context}",
            self.limit, self.what
        );
    }
}
