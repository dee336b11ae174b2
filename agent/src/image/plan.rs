//! The image fetch's decisions, as a pure state machine: what to ask which
//! job server for next, given what happened. [`super::fetch`] does the I/O
//! and asks the [`Plan`] after every event, so every retry rule is tested
//! here without a socket.
//!
//! The rules (step 3 of `/init`, the image stream):
//! - a dropped connection resumes on the same source with `Range` from the
//!   last byte received, a few times in a row without progress at most;
//! - `503`/`429` waits as told (`Retry-After`, capped), a bounded number of
//!   times per source;
//! - a checksum mismatch, a refusal (`404`, a wrong size) or a dead source
//!   restarts from zero on the next source (the caller wipes the staging
//!   area first), after a jittered backoff;
//! - after [`MAX_ROUNDS`] passes over every source, give up (the caller
//!   reports a fatal error and, unless told to drop to a rescue shell,
//!   starts over later).

use std::time::Duration;

/// Resumes of one source in a row that brought no new byte.
pub const MAX_RESUMES: u32 = 3;
/// `503` waits per source and attempt.
pub const MAX_BUSY_WAITS: u32 = 30;
/// Passes over the whole source list before giving up.
pub const MAX_ROUNDS: u32 = 3;
/// The first resume's backoff; it doubles with each resume in a row.
pub const RESUME_BACKOFF: Duration = Duration::from_millis(500);
/// The restart backoff of the first round; it doubles each round, capped
/// at [`MAX_RESTART_BACKOFF`], and is jittered down to half.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The longest restart backoff.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// After `after`, `GET` source `source` from byte `from` (a `Range`
    /// request unless 0).
    Request {
        /// The index in the source list.
        source: usize,
        /// The first byte wanted.
        from: u64,
        /// How long to wait first.
        after: Duration,
    },
    /// Wipe the staging area, then after `after` start again from byte 0
    /// on source `source`.
    Restart {
        /// The index in the source list.
        source: usize,
        /// How long to wait first.
        after: Duration,
    },
    /// Every source failed [`MAX_ROUNDS`] times.
    GiveUp,
}

/// Why a source was given up on, for the console and the control service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceFailure {
    /// The bytes did not hash to the recorded sha256.
    Mismatch,
    /// The source answered something that is not the image (the reason).
    Refused(String),
    /// The source stopped answering (the last error).
    Dead(String),
    /// The stream was not a valid image (bad zstd or tar; the reason).
    BadImage(String),
    /// Busy for too long.
    Busy,
}

impl std::fmt::Display for SourceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceFailure::Mismatch => {
                f.write_str("checksum mismatch: the bytes are not the published image")
            }
            SourceFailure::Refused(why) => write!(f, "refused: {why}"),
            SourceFailure::Dead(why) => write!(f, "not answering: {why}"),
            SourceFailure::BadImage(why) => write!(f, "not a valid image: {why}"),
            SourceFailure::Busy => write!(f, "busy for {MAX_BUSY_WAITS} tries in a row"),
        }
    }
}

/// The fetch's state: where it is, and how much patience is left.
#[derive(Debug, Clone)]
pub struct Plan {
    sources: usize,
    source: usize,
    /// Sources given up on so far, over all rounds.
    failures: u32,
    /// Resumes in a row without a new byte.
    resumes: u32,
    /// The offset the last resume asked from.
    resumed_from: Option<u64>,
    /// `503` waits on the current source in this attempt.
    busy: u32,
}

impl Plan {
    /// A plan over `sources` sources, starting at the first; `None` with no
    /// source at all.
    pub fn new(sources: usize) -> Option<(Plan, Next)> {
        if sources == 0 {
            return None;
        }
        let plan = Plan {
            sources,
            source: 0,
            failures: 0,
            resumes: 0,
            resumed_from: None,
            busy: 0,
        };
        Some((
            plan,
            Next::Request {
                source: 0,
                from: 0,
                after: Duration::ZERO,
            },
        ))
    }

    /// The source in use.
    pub fn source(&self) -> usize {
        self.source
    }

    /// The connection dropped, or could not be made, with `at` bytes
    /// received in all: resume from there, or give the source up.
    pub fn dropped(&mut self, at: u64, why: &str, random: u32) -> Next {
        if self.resumed_from.is_some_and(|from| at > from) {
            self.resumes = 0;
        }
        self.resumes += 1;
        self.resumed_from = Some(at);
        if self.resumes > MAX_RESUMES {
            return self.failed(&SourceFailure::Dead(why.to_owned()), random);
        }
        Next::Request {
            source: self.source,
            from: at,
            after: RESUME_BACKOFF * (1 << (self.resumes - 1).min(8)),
        }
    }

    /// The source said it is busy: wait `wait`, then ask again from `at`.
    pub fn busy(&mut self, at: u64, wait: Duration, random: u32) -> Next {
        self.busy += 1;
        if self.busy > MAX_BUSY_WAITS {
            return self.failed(&SourceFailure::Busy, random);
        }
        Next::Request {
            source: self.source,
            from: at,
            after: wait,
        }
    }

    /// The source is given up on: restart on the next one, or give up.
    /// `random` jitters the backoff (any value; the caller's randomness).
    pub fn failed(&mut self, _why: &SourceFailure, random: u32) -> Next {
        self.failures += 1;
        self.resumes = 0;
        self.resumed_from = None;
        self.busy = 0;
        let limit = u32::try_from(self.sources)
            .unwrap_or(u32::MAX)
            .saturating_mul(MAX_ROUNDS);
        if self.failures >= limit {
            return Next::GiveUp;
        }
        self.source = (self.source + 1) % self.sources;
        let round = self.failures / u32::try_from(self.sources).unwrap_or(u32::MAX).max(1);
        let base = RESTART_BACKOFF
            .saturating_mul(1 << round.min(16))
            .min(MAX_RESTART_BACKOFF);
        Next::Restart {
            source: self.source,
            after: jitter(base, random),
        }
    }
}

/// `base` scaled into `[base/2, base]` by `random`.
fn jitter(base: Duration, random: u32) -> Duration {
    let half = base / 2;
    half + half.mul_f64(f64::from(random) / f64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(source: usize, from: u64) -> impl Fn(&Next) -> bool {
        move |next| matches!(next, Next::Request { source: s, from: f, .. } if *s == source && *f == from)
    }

    #[test]
    fn drops_resume_from_the_last_byte_until_progress_stops() {
        let (mut plan, first) = Plan::new(2).expect("sources");
        assert!(request(0, 0)(&first));
        // Progress each time: resumes never run out.
        for at in [100, 200, 300, 400, 500, 600] {
            let next = plan.dropped(at, "reset", 0);
            assert!(request(0, at)(&next), "{next:?}");
        }
        // No progress: MAX_RESUMES more tries, then the next source from 0.
        let mut waits = Vec::new();
        for _ in 0..MAX_RESUMES - 1 {
            match plan.dropped(600, "refused", 0) {
                Next::Request { after, from, .. } => {
                    assert_eq!(from, 600);
                    waits.push(after);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(waits.windows(2).all(|w| w[0] < w[1]), "{waits:?}");
        assert!(matches!(
            plan.dropped(600, "refused", 0),
            Next::Restart { source: 1, .. }
        ));
    }

    #[test]
    fn busy_waits_as_told_then_moves_on() {
        let (mut plan, _) = Plan::new(2).expect("sources");
        let wait = Duration::from_secs(7);
        for _ in 0..MAX_BUSY_WAITS {
            assert_eq!(
                plan.busy(0, wait, 0),
                Next::Request {
                    source: 0,
                    from: 0,
                    after: wait
                }
            );
        }
        assert!(matches!(
            plan.busy(0, wait, 0),
            Next::Restart { source: 1, .. }
        ));
        // The count starts over on the new source.
        assert!(request(1, 0)(&plan.busy(0, wait, 0)));
    }

    #[test]
    fn failures_go_round_the_sources_with_growing_jittered_backoff_then_give_up() {
        let (mut plan, _) = Plan::new(2).expect("sources");
        let mut seen = Vec::new();
        for _ in 0..2 * MAX_ROUNDS - 1 {
            match plan.failed(&SourceFailure::Mismatch, u32::MAX) {
                Next::Restart { source, after } => seen.push((source, after)),
                other => panic!("{other:?}"),
            }
        }
        let sources: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(sources, [1, 0, 1, 0, 1]);
        assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1), "{seen:?}");
        assert!(seen.iter().all(|s| s.1 <= MAX_RESTART_BACKOFF));
        assert_eq!(plan.failed(&SourceFailure::Mismatch, 0), Next::GiveUp);

        // Jitter keeps a backoff within [base/2, base].
        let base = Duration::from_secs(4);
        assert_eq!(jitter(base, 0), base / 2);
        assert_eq!(jitter(base, u32::MAX), base);
        assert!(Plan::new(0).is_none());
    }
}
