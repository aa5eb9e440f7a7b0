//! The truth against the cost model computed independently. Every test runs on tokio's paused
//! clock (`start_paused`): the simulator's timers then fire exactly at their deadlines, so each
//! sub-phase equals its nominal cost to the nanosecond (the link's deadlines round up to one).

use std::time::Duration;

use super::*;
use crate::{CostModel, SimEvent, StepShape};

const NS: Duration = Duration::from_nanos(1);

fn close(what: &str, got: Option<Duration>, want: Duration, slack: Duration) {
    let got = got.unwrap_or_else(|| panic!("{what}: missing"));
    let diff = got.abs_diff(want);
    assert!(diff <= slack, "{what}: {got:?} vs {want:?}");
}

async fn drain(stream: &mut TokenStream) -> u32 {
    let mut tokens = 0;
    while let Some(ev) = stream.recv().await {
        if let Ok(SimEvent::Token(_)) = ev {
            tokens += 1;
        }
    }
    tokens
}

async fn run(sim: &DisaggSim, req: SimRequest) -> PdTruth {
    let (id, mut stream) = sim.serve(req).await.unwrap();
    drain(&mut stream).await;
    sim.truth(id).unwrap()
}

/// Costs in whole milliseconds (tokio's timers tick every millisecond, also on the paused
/// clock): each step ends exactly at its deadline. 1000 prompt tokens move in 2 ms.
fn test_config() -> DisaggConfig {
    let cost = CostModel {
        prefill_base: Duration::from_millis(5),
        prefill_per_token: Duration::from_micros(60),
        decode_base: Duration::from_millis(7),
        decode_per_seq: Duration::from_millis(1),
        context_per_token: Duration::ZERO,
    };
    let engine = SimConfig {
        cost,
        ..Default::default()
    };
    DisaggConfig {
        prefill: engine.clone(),
        decode: engine,
        routing: Duration::from_millis(1),
        handshake: Duration::from_millis(1),
        // 1000 × 131 072 bytes in 2 ms
        link_bandwidth: 65.536e9,
        ..Default::default()
    }
}

fn step(cfg: &SimConfig, prefill_tokens: u64, decode_seqs: u64) -> Duration {
    cfg.cost.step_duration(&StepShape {
        prefill_tokens,
        decode_seqs,
        decode_context_tokens: 0,
    })
}

/// One request alone: every sub-phase is its nominal cost, and they add up to TTFT.
#[tokio::test(start_paused = true)]
async fn one_request_alone_costs_exactly_the_model() {
    let cfg = test_config();
    let sim = DisaggSim::start(cfg.clone()).unwrap();
    let t = run(&sim, SimRequest::new(1000, 4).with_output_tokens(4)).await;
    let prefill_step = |n| step(&cfg.prefill, n, 0);
    let decode_step = |_ctx: u64| step(&cfg.decode, 0, 1);
    assert_eq!(t.routing(), cfg.routing);
    close(
        "prefill queue",
        t.prefill_queue(),
        Duration::ZERO,
        Duration::ZERO,
    );
    // 5 ms + 1000 × 60 µs
    assert_eq!(prefill_step(1000), Duration::from_millis(65));
    close("prefill", t.prefill(), prefill_step(1000), Duration::ZERO);
    close("bootstrap", t.bootstrap(), cfg.handshake, Duration::ZERO);
    close(
        "kv alloc wait",
        t.kv_alloc_wait(),
        Duration::ZERO,
        Duration::ZERO,
    );
    // 1000 tokens × 128 KiB ÷ 65.536 GB/s = 2 ms
    let alone = Duration::from_millis(2);
    assert_eq!(t.kv_bytes, 1000 * 131_072);
    close("kv transfer", t.kv_transfer(), alone, NS);
    close("transfer_time", Some(cfg.transfer_time(1000)), alone, NS);
    close(
        "decode wait",
        t.decode_wait(),
        Duration::ZERO,
        Duration::ZERO,
    );
    // The first decode step: 7 ms + 1 ms.
    close(
        "first token",
        t.first_token(),
        decode_step(1000),
        Duration::ZERO,
    );
    let decode: Duration = (1001..1004).map(decode_step).sum();
    close("decode", t.decode(), decode, Duration::ZERO);
    let sum = t.routing()
        + t.prefill_queue().unwrap()
        + t.prefill().unwrap()
        + t.bootstrap().unwrap()
        + t.kv_transfer().unwrap()
        + t.decode_wait().unwrap()
        + t.first_token().unwrap();
    close("ttft = the sub-phases", t.ttft(), sum, Duration::ZERO);
    assert_eq!(t.decode.as_ref().unwrap().output_tokens, 4);
    // The decode worker never prefills: its KV cache came over the link.
    assert_eq!(t.decode.as_ref().unwrap().prefill_steps, 0);
    assert_eq!(t.prefill.as_ref().unwrap().output_tokens, 1);
    assert_eq!(
        t.outcome(),
        Some(TruthOutcome::Finished(FinishReason::Length))
    );
    // Everything was given back.
    assert_eq!(sim.decode_kv_used(0), Some(0));
}

/// Two transfers together on one link each take twice as long; on two links, each its own.
#[tokio::test(start_paused = true)]
async fn concurrent_transfers_share_a_link() {
    for prefill_workers in [1, 2] {
        let cfg = DisaggConfig {
            prefill_workers,
            decode_workers: 2,
            ..test_config()
        };
        let sim = DisaggSim::start(cfg.clone()).unwrap();
        let prefill_step = |n| step(&cfg.prefill, n, 0);
        let req = || SimRequest::new(1000, 2).with_output_tokens(2);
        let (a, b) = tokio::join!(run(&sim, req()), run(&sim, req()));
        // Least loaded: the second request goes to the other decode worker (and prefill
        // worker, when there are two).
        assert_ne!(a.decode_worker, b.decode_worker);
        let alone = Duration::from_millis(2);
        if prefill_workers == 1 {
            // One prefill step of both prompts: 5 ms + 2000 × 60 µs.
            close("prefill a", a.prefill(), prefill_step(2000), Duration::ZERO);
            assert_eq!(a.transfer_start, b.transfer_start);
            close("shared a", a.kv_transfer(), alone * 2, 2 * NS);
            close("shared b", b.kv_transfer(), alone * 2, 2 * NS);
        } else {
            assert_ne!(a.prefill_worker, b.prefill_worker);
            close("prefill a", a.prefill(), prefill_step(1000), Duration::ZERO);
            close("own link a", a.kv_transfer(), alone, NS);
            close("own link b", b.kv_transfer(), alone, NS);
        }
    }
}

/// A transfer that starts while another is half done: shares change at that instant.
#[tokio::test(start_paused = true)]
async fn processor_sharing_follows_the_arrivals() {
    let lateness = Arc::new(Mutex::new(Lateness::default()));
    let link = Link::start(1e9, lateness);
    let t0 = clock::now();
    let first = tokio::spawn({
        let link = link.clone();
        async move { link.transfer(2_000_000, t0).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = link.transfer(2_000_000, clock::now()).await.unwrap();
    let first = first.await.unwrap();
    // 2 MB at 1 GB/s: alone for 1 ms (half done), then both at half speed: the first needs
    // 2 ms more, the second is half done by then and alone again for its last 1 ms.
    close("first", Some(first - t0), Duration::from_millis(3), NS);
    close("second", Some(second - t0), Duration::from_millis(4), NS);
}

/// A full decode KV memory makes the next bootstrap wait until a request leaves the decode
/// worker; the wait is part of the bootstrap.
#[tokio::test(start_paused = true)]
async fn full_decode_memory_makes_the_next_request_wait() {
    let cfg = DisaggConfig {
        // One sequence of 1000 + 4 tokens fits, two do not.
        decode_kv_tokens: 1500,
        ..test_config()
    };
    let sim = DisaggSim::start(cfg.clone()).unwrap();
    let req = || SimRequest::new(1000, 4).with_output_tokens(4);
    let (a, b) = tokio::join!(run(&sim, req()), run(&sim, req()));
    let (first, second) = if a.kv_alloc_wait() == Some(Duration::ZERO) {
        (a, b)
    } else {
        (b, a)
    };
    close(
        "first waits not",
        first.kv_alloc_wait(),
        Duration::ZERO,
        Duration::ZERO,
    );
    let freed = first.decode.as_ref().unwrap().finished.unwrap();
    assert_eq!(second.kv_allocated, Some(freed));
    close(
        "second's bootstrap",
        second.bootstrap(),
        freed - second.bootstrap_start.unwrap() + cfg.handshake,
        Duration::ZERO,
    );
    // The wait is the first request's transfer and whole decode.
    let first_decode =
        first.decode_wait().unwrap() + first.first_token().unwrap() + first.decode().unwrap();
    close(
        "wait",
        second.kv_alloc_wait(),
        cfg.handshake + first.kv_transfer().unwrap() + first_decode,
        NS,
    );
    assert_eq!(sim.decode_kv_used(0), Some(0));
    // A sequence larger than the whole memory is refused at the router.
    let too_big = sim.serve(SimRequest::new(1400, 200)).await;
    assert!(matches!(too_big, Err(SimError::InvalidRequest(_))));
}

/// A decode batch that is full makes the KV-ready request wait for a slot: the decode wait.
#[tokio::test(start_paused = true)]
async fn a_full_decode_batch_is_the_decode_wait() {
    let sim = DisaggSim::start(DisaggConfig {
        decode: SimConfig {
            max_num_seqs: 1,
            ..test_config().decode
        },
        ..test_config()
    })
    .unwrap();
    let req = || SimRequest::new(100, 3).with_output_tokens(3);
    let (a, b) = tokio::join!(run(&sim, req()), run(&sim, req()));
    let (first, second) = if a.decode_wait() == Some(Duration::ZERO) {
        (a, b)
    } else {
        (b, a)
    };
    let freed = first.decode.as_ref().unwrap().finished.unwrap();
    let second_decode = second.decode.as_ref().unwrap();
    assert_eq!(second_decode.scheduled, Some(freed));
    close(
        "decode wait",
        second.decode_wait(),
        freed - second_decode.submitted,
        Duration::ZERO,
    );
    assert!(second.decode_wait().unwrap() > Duration::ZERO);
}

#[tokio::test]
async fn refuses_unusable_configs() {
    let bad = [
        DisaggConfig {
            prefill_workers: 0,
            ..Default::default()
        },
        DisaggConfig {
            link_bandwidth: 0.0,
            ..Default::default()
        },
        DisaggConfig {
            decode_kv_tokens: 0,
            ..Default::default()
        },
        DisaggConfig {
            time_scale: f64::NAN,
            ..Default::default()
        },
    ];
    for cfg in bad {
        assert!(DisaggSim::start(cfg).is_err());
    }
    let sim = DisaggSim::start(DisaggConfig::default()).unwrap();
    assert!(sim.prefill(99, ()).is_err());
    assert!(sim.decode(99, ()).is_err());
}
