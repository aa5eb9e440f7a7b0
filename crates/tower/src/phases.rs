//! Phase boundaries of one request, computed once at its end from the marks the hot path stored.
//!
//! Every input is an offset from arrival on one monotonic clock, so the phases can neither
//! overlap wrongly nor go negative: each boundary is clamped into `[previous boundary, end]`.

use std::time::Duration;

use crate::config::PhaseSource;

/// The marks a request left, as offsets from arrival.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Marks {
    /// The configured source.
    pub(crate) source: Option<PhaseSource>,
    /// Engine: scheduled.
    pub(crate) scheduled: Option<Duration>,
    /// Engine: first token.
    pub(crate) first_token: Option<Duration>,
    /// Engine: latest token.
    pub(crate) last_token: Option<Duration>,
    /// Admission queue: admitted (None without an admission queue).
    pub(crate) admitted: Option<Duration>,
    /// It waited in the admission queue and ended there (cancelled, failed) before a slot.
    pub(crate) never_admitted: bool,
    /// A response head went out (a request that ended before it never reached its response).
    pub(crate) responded: bool,
    /// Answered with a client error or a refusal (a handler's own 400 or 429): the engine most
    /// likely never worked on it.
    pub(crate) refused: bool,
    /// Its outcome is `ok`.
    pub(crate) ok: bool,
    /// Its operation is all prefill (`embeddings`): a unary answer ends its prefill.
    pub(crate) prefill_only: bool,
    /// Body: first non-empty data frame.
    pub(crate) first_chunk: Option<Duration>,
    /// Body: last non-empty data frame.
    pub(crate) last_chunk: Option<Duration>,
    /// Whether the response is a stream (SSE, several gRPC messages, or the recorder says so).
    pub(crate) streamed: bool,
    /// End of the request (end of body, error, cancel).
    pub(crate) end: Duration,
}

/// One phase: `[start, end]` offsets from arrival.
pub(crate) type Interval = (Duration, Duration);

/// The phases to emit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Phases {
    /// Where the boundaries came from (may fall back from engine to derived).
    pub(crate) source: Option<PhaseSource>,
    pub(crate) queue: Option<Interval>,
    pub(crate) prefill: Option<Interval>,
    pub(crate) decode: Option<Interval>,
    /// Derived mode, non-streamed: admitted → end, when prefill and decode cannot be told apart.
    pub(crate) inference: Option<Interval>,
    /// Arrival → first token (engine) or first chunk (derived, streamed).
    pub(crate) time_to_first_token: Option<Duration>,
    /// The response's chunks stand for its tokens (a stream split at its chunks: derived, or
    /// an engine that marked no token), so they count its tokens where usage does not.
    pub(crate) chunks_are_tokens: bool,
}

fn clamp(t: Duration, lo: Duration, hi: Duration) -> Duration {
    t.max(lo).min(hi.max(lo))
}

impl Phases {
    /// Computes the phases from `m` (see [`PhaseSource`] for the two rules).
    pub(crate) fn compute(m: &Marks) -> Phases {
        let end = m.end;
        if m.never_admitted {
            // Its whole time was the wait for a slot, whatever the source.
            return Phases {
                queue: Some((Duration::ZERO, end)),
                ..Phases::default()
            };
        }
        let engine_marked = m.scheduled.is_some() || m.first_token.is_some();
        let engine = m.source == Some(PhaseSource::Engine);
        if engine && engine_marked {
            return Self::from_engine(m, end);
        }
        // Refused with no engine mark (a handler's own 400 or 429, its error body included):
        // the engine most likely never saw it, and its time was no inference. A stream that
        // sent tokens and then ended with a client-error status (gRPC can) keeps the split
        // its chunks give.
        let streamed_output = m.streamed && m.first_chunk.is_some();
        if (m.refused && !streamed_output)
            || (engine && (m.streamed || !m.responded) && m.first_chunk.is_none())
        {
            return Self::unscheduled(m, end);
        }
        Self::derived(m, end)
    }

    /// An engine stream, or an engine request with no response yet, that ended before the
    /// engine scheduled it and before any output (a client gone while it was queued, a failure
    /// before the engine saw it), or one refused with no engine mark (a client error, a
    /// rejection): only the layer's own admission queue is known. The rest is left to the
    /// request span, not called prefill as the derived rule would: an engine's queue is where
    /// such requests usually wait. (A unary response sends nothing before its
    /// end by design: it keeps the derived `inference` span, which invents no split.)
    fn unscheduled(m: &Marks, end: Duration) -> Phases {
        Phases {
            queue: m
                .admitted
                .map(|a| (Duration::ZERO, clamp(a, Duration::ZERO, end))),
            ..Phases::default()
        }
    }

    fn from_engine(m: &Marks, end: Duration) -> Phases {
        let mut p = Phases {
            source: Some(PhaseSource::Engine),
            ..Phases::default()
        };
        let zero = Duration::ZERO;
        let scheduled = m.scheduled.map(|s| clamp(s, zero, end));
        let admitted = m.admitted.map(|a| clamp(a, zero, end));
        // Without a `scheduled` mark the layer's own admission queue still bounds the queue.
        let queue_end = scheduled.or(admitted);
        if let Some(q) = queue_end {
            p.queue = Some((zero, q));
        }
        let prefill_start = queue_end.unwrap_or(zero);
        // An engine that marks `scheduled` but no token: a stream's chunks stand for its tokens,
        // as in derived mode (its whole response was not prefill).
        let (first_token, last_token) = match (m.first_token, m.first_chunk) {
            (None, Some(chunk)) if m.streamed => {
                p.chunks_are_tokens = true;
                (Some(chunk), m.last_chunk)
            }
            _ => (m.first_token, m.last_token),
        };
        match first_token.map(|f| clamp(f, prefill_start, end)) {
            Some(first) => {
                p.prefill = Some((prefill_start, first));
                p.time_to_first_token = Some(first);
                let last = clamp(last_token.unwrap_or(first), first, end);
                p.decode = Some((first, last));
            }
            // A unary answer to a generation, no token marked: when its first token came is
            // not known, so prefill and decode are not told apart (as in derived mode).
            None if m.ok && !m.streamed && !m.prefill_only => {
                p.inference = Some((prefill_start, end));
            }
            // Ended (error, cancel) before the first token, or all prefill (embeddings): the
            // time went to prefill.
            None => p.prefill = Some((prefill_start, end)),
        }
        p
    }

    fn derived(m: &Marks, end: Duration) -> Phases {
        let mut p = Phases {
            source: Some(PhaseSource::Derived),
            ..Phases::default()
        };
        let zero = Duration::ZERO;
        let start = m.admitted.map(|a| clamp(a, zero, end)).unwrap_or(zero);
        if m.admitted.is_some() {
            p.queue = Some((zero, start));
        }
        if m.streamed {
            p.chunks_are_tokens = true;
            match m.first_chunk.map(|f| clamp(f, start, end)) {
                Some(first) => {
                    p.prefill = Some((start, first));
                    p.time_to_first_token = Some(first);
                    let last = clamp(m.last_chunk.unwrap_or(first), first, end);
                    p.decode = Some((first, last));
                }
                None => p.prefill = Some((start, end)),
            }
        } else {
            p.inference = Some((start, end));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A handler's own 400 or 429 in engine mode, no mark made: no `inference` phase (the
    /// engine never saw it); only the admission queue's wait, where there is one.
    #[test]
    fn a_failure_without_engine_marks_is_no_inference() {
        let marks = Marks {
            source: Some(PhaseSource::Engine),
            responded: true,
            refused: true,
            // Its error body.
            first_chunk: Some(ms(40)),
            last_chunk: Some(ms(40)),
            end: ms(41),
            ..Marks::default()
        };
        assert_eq!(Phases::compute(&marks), Phases::default());
        let p = Phases::compute(&Marks {
            admitted: Some(ms(30)),
            ..marks
        });
        assert_eq!(p.queue, Some((ms(0), ms(30))));
        assert_eq!((p.inference, p.prefill), (None, None));
        // The same answer succeeding keeps the derived split it always had.
        let p = Phases::compute(&Marks {
            refused: false,
            ..marks
        });
        assert_eq!(p.inference, Some((ms(0), ms(41))));
        // In derived mode too.
        let derived = Marks {
            source: Some(PhaseSource::Derived),
            ..marks
        };
        assert_eq!(Phases::compute(&derived), Phases::default());
        // A gRPC stream that sent tokens and then ended with a client-error status keeps the
        // split its chunks give (a re-review saw it lose every phase in derived mode).
        let p = Phases::compute(&Marks {
            streamed: true,
            first_chunk: Some(ms(20)),
            ..derived
        });
        assert_eq!(
            (p.prefill, p.decode),
            (Some((ms(0), ms(20))), Some((ms(20), ms(40))))
        );
    }

    /// A unary answer marked `scheduled` but no token: its generation is not called prefill
    /// (a review: a 300 ms generation read as all prefill) but `inference` from the schedule;
    /// an embedding's is all prefill, and a failure before any token keeps its prefill.
    #[test]
    fn a_unary_answer_without_token_marks_is_inference_from_its_schedule() {
        let marks = Marks {
            source: Some(PhaseSource::Engine),
            scheduled: Some(ms(100)),
            responded: true,
            ok: true,
            first_chunk: Some(ms(403)),
            last_chunk: Some(ms(403)),
            end: ms(404),
            ..Marks::default()
        };
        let p = Phases::compute(&marks);
        assert_eq!(p.source, Some(PhaseSource::Engine));
        assert_eq!(p.queue, Some((ms(0), ms(100))));
        assert_eq!(p.inference, Some((ms(100), ms(404))));
        assert_eq!(
            (p.prefill, p.decode, p.time_to_first_token),
            (None, None, None)
        );
        let p = Phases::compute(&Marks {
            prefill_only: true,
            ..marks
        });
        assert_eq!((p.prefill, p.inference), (Some((ms(100), ms(404))), None));
        let p = Phases::compute(&Marks { ok: false, ..marks });
        assert_eq!((p.prefill, p.inference), (Some((ms(100), ms(404))), None));
    }

    /// An engine that marks only `scheduled` on a stream: prefill ends at the first chunk, not
    /// at the end of the response (a review read a 663 ms stream as all prefill, its first
    /// token at 303 ms).
    #[test]
    fn a_stream_without_token_marks_splits_at_its_first_chunk() {
        let marks = Marks {
            source: Some(PhaseSource::Engine),
            scheduled: Some(ms(100)),
            first_chunk: Some(ms(303)),
            last_chunk: Some(ms(760)),
            streamed: true,
            responded: true,
            end: ms(765),
            ..Marks::default()
        };
        let p = Phases::compute(&marks);
        assert_eq!(p.source, Some(PhaseSource::Engine));
        assert_eq!(p.queue, Some((ms(0), ms(100))));
        assert_eq!(p.prefill, Some((ms(100), ms(303))));
        assert_eq!(p.decode, Some((ms(303), ms(760))));
        assert_eq!(p.time_to_first_token, Some(ms(303)));
        // Without a chunk it ended before any output: prefill to the end, as before.
        let p = Phases::compute(&Marks {
            first_chunk: None,
            last_chunk: None,
            ..marks
        });
        assert_eq!(p.prefill, Some((ms(100), ms(765))));
        assert_eq!(p.time_to_first_token, None);
    }

    #[test]
    fn engine_marks_give_three_phases() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            scheduled: Some(ms(10)),
            first_token: Some(ms(50)),
            last_token: Some(ms(200)),
            first_chunk: Some(ms(51)),
            last_chunk: Some(ms(201)),
            streamed: true,
            end: ms(202),
            ..Marks::default()
        });
        assert_eq!(p.source, Some(PhaseSource::Engine));
        assert_eq!(p.queue, Some((ms(0), ms(10))));
        assert_eq!(p.prefill, Some((ms(10), ms(50))));
        assert_eq!(p.decode, Some((ms(50), ms(200))));
        assert_eq!(p.inference, None);
        assert_eq!(p.time_to_first_token, Some(ms(50)));
    }

    #[test]
    fn engine_without_marks_falls_back_to_derived() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            admitted: Some(ms(5)),
            first_chunk: Some(ms(30)),
            last_chunk: Some(ms(90)),
            streamed: true,
            end: ms(91),
            ..Marks::default()
        });
        assert_eq!(p.source, Some(PhaseSource::Derived));
        assert_eq!(p.queue, Some((ms(0), ms(5))));
        assert_eq!(p.prefill, Some((ms(5), ms(30))));
        assert_eq!(p.decode, Some((ms(30), ms(90))));
    }

    /// A request that ended while it waited for a slot in the layer's admission queue: its
    /// whole time is the queue, in either mode.
    #[test]
    fn a_request_ended_in_the_admission_queue_is_all_queue() {
        for source in [PhaseSource::Engine, PhaseSource::Derived] {
            let p = Phases::compute(&Marks {
                source: Some(source),
                never_admitted: true,
                end: ms(200),
                ..Marks::default()
            });
            assert_eq!(p.queue, Some((ms(0), ms(200))), "{source:?}");
            assert_eq!((p.prefill, p.decode, p.inference), (None, None, None));
            assert_eq!(p.time_to_first_token, None);
        }
    }

    /// An engine request that ended before its handler answered and before the engine
    /// scheduled it (a client gone while the engine queued it): no phase is made up; a derived
    /// one keeps its `inference` span (it invents no split).
    #[test]
    fn an_engine_request_ended_before_its_response_and_schedule_has_no_inference() {
        let marks = |source| Marks {
            source: Some(source),
            admitted: Some(ms(1)),
            end: ms(150),
            ..Marks::default()
        };
        let p = Phases::compute(&marks(PhaseSource::Engine));
        assert_eq!(p.queue, Some((ms(0), ms(1))));
        assert_eq!((p.prefill, p.inference), (None, None));
        let p = Phases::compute(&marks(PhaseSource::Derived));
        assert_eq!(p.inference, Some((ms(1), ms(150))));
        // Answered (a unary response, all at its end): the derived `inference` span.
        let p = Phases::compute(&Marks {
            responded: true,
            ..marks(PhaseSource::Engine)
        });
        assert_eq!(p.inference, Some((ms(1), ms(150))));
    }

    /// A client that gave up while the engine still queued its request: no prefill is made up
    /// for the wait; the admission queue, when there is one, is still known.
    #[test]
    fn engine_request_ended_before_it_was_scheduled_has_no_prefill() {
        for admitted in [None, Some(ms(4))] {
            let p = Phases::compute(&Marks {
                source: Some(PhaseSource::Engine),
                admitted,
                streamed: true,
                end: ms(30),
                ..Marks::default()
            });
            assert_eq!(p.prefill, None);
            assert_eq!(p.inference, None);
            assert_eq!(p.decode, None);
            assert_eq!(p.time_to_first_token, None);
            assert_eq!(p.queue, admitted.map(|a| (ms(0), a)));
            assert_eq!(p.source, None);
        }
        // A unary response (its head went out) cut short the same way keeps its derived
        // inference span.
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            admitted: Some(ms(4)),
            streamed: false,
            responded: true,
            end: ms(30),
            ..Marks::default()
        });
        assert_eq!(p.source, Some(PhaseSource::Derived));
        assert_eq!(p.inference, Some((ms(4), ms(30))));
        assert_eq!(p.prefill, None);
    }

    #[test]
    fn derived_non_streamed_gives_one_inference_span() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Derived),
            admitted: Some(ms(7)),
            first_chunk: Some(ms(80)),
            last_chunk: Some(ms(80)),
            streamed: false,
            end: ms(81),
            ..Marks::default()
        });
        assert_eq!(p.queue, Some((ms(0), ms(7))));
        assert_eq!(p.inference, Some((ms(7), ms(81))));
        assert_eq!(
            (p.prefill, p.decode, p.time_to_first_token),
            (None, None, None)
        );
    }

    #[test]
    fn no_admission_queue_means_no_queue_span_in_derived_mode() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Derived),
            end: ms(9),
            ..Marks::default()
        });
        assert_eq!(p.queue, None);
        assert_eq!(p.inference, Some((ms(0), ms(9))));
    }

    #[test]
    fn engine_without_scheduled_mark_uses_the_admission_queue() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            admitted: Some(ms(12)),
            first_token: Some(ms(30)),
            last_token: Some(ms(60)),
            end: ms(61),
            ..Marks::default()
        });
        assert_eq!(p.source, Some(PhaseSource::Engine));
        assert_eq!(p.queue, Some((ms(0), ms(12))));
        assert_eq!(p.prefill, Some((ms(12), ms(30))));
        assert_eq!(p.decode, Some((ms(30), ms(60))));
    }

    #[test]
    fn ended_before_first_token_is_all_prefill() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            scheduled: Some(ms(3)),
            end: ms(40),
            ..Marks::default()
        });
        assert_eq!(p.prefill, Some((ms(3), ms(40))));
        assert_eq!(p.decode, None);
    }

    #[test]
    fn marks_past_the_end_are_clamped_and_never_negative() {
        let p = Phases::compute(&Marks {
            source: Some(PhaseSource::Engine),
            scheduled: Some(ms(50)),
            first_token: Some(ms(20)), // out of order: clamped to scheduled
            last_token: Some(ms(500)), // after end: clamped to end
            end: ms(100),
            ..Marks::default()
        });
        assert_eq!(p.queue, Some((ms(0), ms(50))));
        assert_eq!(p.prefill, Some((ms(50), ms(50))));
        assert_eq!(p.decode, Some((ms(50), ms(100))));
    }
}
