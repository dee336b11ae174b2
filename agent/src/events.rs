//! A booting node's events sent from a thread of their own ([`Reporter`]):
//! the image stream never waits for the control service, and what the node
//! reported while a post was in flight goes out in the next one, as one
//! batch (`POST /api/v1/boot/events/batch`). In a boot storm the control
//! service answers slowly, so a node's progress reports gather into few
//! requests instead of queueing behind each other; on a quiet network each
//! goes out at once, alone.
//!
//! The events keep their order. A [`Reporter`] dropped (a fatal error
//! ends the boot attempt) still sends what it holds before it is gone, so
//! the failure reported after it comes last on the timeline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use mprov_api::boot::{BootEventReport, BootPhase, MAX_BATCH};

use crate::enroll::Control;
use crate::image::{Event, plan::SourceFailure};

/// Which of an image stream's events `/init` reports, and as what phase:
/// the start, a checksum mismatch, a failed source and the verification
/// once each, and progress each time another tenth of the image is in.
/// Shared by the streaming threads (the tenths are counted atomically).
#[derive(Debug)]
pub struct StreamSteps {
    next_tenth: AtomicU64,
}

impl Default for StreamSteps {
    fn default() -> Self {
        StreamSteps {
            next_tenth: AtomicU64::new(1),
        }
    }
}

impl StreamSteps {
    /// The phase `event` is reported as, if it is reported.
    pub fn phase(&self, event: &Event<'_>) -> Option<BootPhase> {
        match event {
            Event::Progress { bytes, size } => {
                let tenth = self.next_tenth.load(Ordering::Relaxed);
                if *size == 0 || *bytes * 10 < *size * tenth {
                    return None;
                }
                self.next_tenth
                    .store(bytes * 10 / size + 1, Ordering::Relaxed);
                Some(BootPhase::Progress)
            }
            Event::Started { from: 0, .. } => Some(BootPhase::ImageStarted),
            Event::SourceFailed {
                why: SourceFailure::Mismatch,
                ..
            } => Some(BootPhase::ChecksumMismatch),
            Event::SourceFailed { .. } => Some(BootPhase::Failed),
            Event::Verified { .. } => Some(BootPhase::Verified),
            _ => None,
        }
    }
}

/// What became of the events a [`Reporter`] was given.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    /// The phases stored, in order.
    pub sent: Vec<BootPhase>,
    /// The ones not stored, each with why (refused, or every try failed).
    pub failed: Vec<(BootPhase, String)>,
    /// How many requests carried them.
    pub posts: usize,
}

/// Sends a node's boot events from its own thread, in batches of what
/// queued while the last post was in flight.
#[derive(Debug)]
pub struct Reporter {
    tx: Option<mpsc::Sender<BootEventReport>>,
    thread: Option<JoinHandle<Tally>>,
}

impl Reporter {
    /// A reporter sending with `control`'s session.
    pub fn start(control: Control) -> Reporter {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("boot-events".into())
            .spawn(move || send_all(&control, &rx));
        match thread {
            Ok(thread) => Reporter {
                tx: Some(tx),
                thread: Some(thread),
            },
            // No thread: the events are counted failed at `finish`.
            Err(_) => Reporter {
                tx: None,
                thread: None,
            },
        }
    }

    /// Queues one step of this node's boot; never waits.
    pub fn report(&self, phase: BootPhase, detail: &str) {
        if let Some(tx) = &self.tx {
            // A send fails only when the thread is gone; `finish` says so.
            let _ = tx.send(BootEventReport {
                phase,
                mac: None,
                system: None,
                ip: None,
                detail: detail.to_owned(),
            });
        }
    }

    /// Waits until every queued event is sent (or has failed every try):
    /// what became of them.
    pub fn finish(mut self) -> Tally {
        self.stop()
    }

    fn stop(&mut self) -> Tally {
        drop(self.tx.take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(tally)) => tally,
            Some(Err(_)) => Tally {
                failed: vec![(BootPhase::Failed, "the boot-events thread panicked".into())],
                ..Tally::default()
            },
            None => Tally {
                failed: vec![(
                    BootPhase::Failed,
                    "no thread could be started to send boot events".into(),
                )],
                ..Tally::default()
            },
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.tx.is_some() {
            let _ = self.stop();
        }
    }
}

/// The thread: each post carries what queued meanwhile (at most
/// [`MAX_BATCH`]), until the reporter is finished and the queue empty.
fn send_all(control: &Control, rx: &mpsc::Receiver<BootEventReport>) -> Tally {
    let mut tally = Tally::default();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        tally.posts += 1;
        match control.report_all(&batch) {
            Ok(outcome) => {
                for (index, event) in batch.iter().enumerate() {
                    match outcome.refused.iter().find(|r| r.index == index) {
                        Some(r) => tally
                            .failed
                            .push((event.phase, format!("HTTP {}: {}", r.status, r.message))),
                        None => tally.sent.push(event.phase),
                    }
                }
            }
            Err(err) => {
                let why = mprov_process::chain(&err);
                tally
                    .failed
                    .extend(batch.iter().map(|e| (e.phase, why.clone())));
            }
        }
    }
    tally
}
