//! Every span, attribute and metric name that infertrace's middleware and collector share.
//!
//! Names follow the OpenTelemetry semantic conventions first (GenAI, HTTP, RPC, hardware), then
//! vLLM's `gen_ai.latency.*` attributes for compatibility, then infertrace's own `infer.*` and
//! `gpu.*` namespaces. Durations are seconds as `f64` unless a constant says otherwise.
//!
//! This crate holds names and nothing else, so both halves of infertrace (and users writing their
//! own engines' marks) agree on them without depending on each other.

#![deny(missing_docs)]

/// Span names used by infertrace.
pub mod span {
    /// Phase span: arrival → scheduled (waiting for a batch slot). Kind INTERNAL.
    pub const QUEUE: &str = "queue";
    /// Phase span: scheduled → first token. Kind INTERNAL.
    pub const PREFILL: &str = "prefill";
    /// Phase span: first token → last token. Kind INTERNAL.
    pub const DECODE: &str = "decode";
    /// Phase span used in derived mode for non-streamed responses: admitted → response complete,
    /// when there is no first-chunk signal to split prefill from decode.
    pub const INFERENCE: &str = "inference";
    /// vLLM's request span name.
    pub const VLLM_REQUEST: &str = "llm_request";
    /// TGI's per-request inference span (linked to batch spans).
    pub const TGI_INFER: &str = "infer";
    /// TGI's batch span.
    pub const TGI_BATCH: &str = "batch";
    /// TGI's queue-wait child span.
    pub const TGI_QUEUED: &str = "queued";
    /// TGI request span names.
    pub const TGI_REQUESTS: [&str; 4] = [
        "generate",
        "generate_stream",
        "completions",
        "chat_completions",
    ];
}

/// GenAI semantic-convention attributes.
pub mod gen_ai {
    /// Operation: `chat`, `text_completion`, `embeddings`, `generate_content`.
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    /// Model the client asked for.
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    /// Model that answered.
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// Maximum output tokens requested (int).
    pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
    /// Whether the client asked for a streamed response (bool).
    pub const REQUEST_STREAM: &str = "gen_ai.request.stream";
    /// Response id.
    pub const RESPONSE_ID: &str = "gen_ai.response.id";
    /// Finish reasons (string array).
    pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// Prompt tokens (int).
    pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// Generated tokens (int).
    pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// Old name of input tokens, still emitted by vLLM.
    pub const USAGE_PROMPT_TOKENS: &str = "gen_ai.usage.prompt_tokens";
    /// Old name of output tokens, still emitted by vLLM.
    pub const USAGE_COMPLETION_TOKENS: &str = "gen_ai.usage.completion_tokens";
    /// vLLM's request id.
    pub const REQUEST_ID: &str = "gen_ai.request.id";
    /// vLLM's sampling temperature.
    pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
    /// vLLM's top-p.
    pub const REQUEST_TOP_P: &str = "gen_ai.request.top_p";
    /// vLLM's n (number of completions).
    pub const REQUEST_N: &str = "gen_ai.request.n";
    /// Token type on token-usage metrics: `input` or `output`.
    pub const TOKEN_TYPE: &str = "gen_ai.token.type";
    /// The serving system (required by the current GenAI conventions; it replaced
    /// `gen_ai.system`), e.g. `vllm`, `sglang`, or the operator's own name.
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    /// Prompt tokens served from the prefix (KV) cache (int), when the engine reports it.
    pub const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    /// Prompt tokens written to a prompt cache (int).
    pub const USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
    /// Operation values.
    pub mod operation {
        /// Chat completion.
        pub const CHAT: &str = "chat";
        /// Plain text completion.
        pub const TEXT_COMPLETION: &str = "text_completion";
        /// Embeddings.
        pub const EMBEDDINGS: &str = "embeddings";
        /// Generic content generation.
        pub const GENERATE_CONTENT: &str = "generate_content";
    }
}

/// vLLM-compatible latency attributes (seconds, `f64`), also emitted by SGLang.
pub mod latency {
    /// Time waiting in the scheduler queue.
    pub const TIME_IN_QUEUE: &str = "gen_ai.latency.time_in_queue";
    /// Arrival → first token.
    pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai.latency.time_to_first_token";
    /// Time in model prefill.
    pub const TIME_IN_MODEL_PREFILL: &str = "gen_ai.latency.time_in_model_prefill";
    /// Time in model decode.
    pub const TIME_IN_MODEL_DECODE: &str = "gen_ai.latency.time_in_model_decode";
    /// Prefill + decode.
    pub const TIME_IN_MODEL_INFERENCE: &str = "gen_ai.latency.time_in_model_inference";
    /// End-to-end latency.
    pub const E2E: &str = "gen_ai.latency.e2e";
    /// vLLM: time spent in the scheduler.
    pub const TIME_IN_SCHEDULER: &str = "gen_ai.latency.time_in_scheduler";
    /// vLLM: time in model forward passes.
    pub const TIME_IN_MODEL_FORWARD: &str = "gen_ai.latency.time_in_model_forward";
    /// vLLM: time in model execute.
    pub const TIME_IN_MODEL_EXECUTE: &str = "gen_ai.latency.time_in_model_execute";
    /// TensorRT-LLM (disaggregated mode): time spent moving the KV cache from the context
    /// (prefill) server to the generation (decode) server.
    pub const KV_CACHE_TRANSFER_TIME: &str = "gen_ai.latency.kv_cache_transfer_time";
}

/// infertrace's own request and phase attributes.
pub mod infer {
    /// Decode time / (output tokens − 1), seconds.
    pub const TIME_PER_OUTPUT_TOKEN: &str = "infer.time_per_output_token";
    /// Arrival → first response body chunk on the wire, seconds.
    pub const TIME_TO_FIRST_CHUNK: &str = "infer.time_to_first_chunk";
    /// Median gap between streamed chunks, seconds.
    pub const INTER_TOKEN_LATENCY_P50: &str = "infer.inter_token_latency.p50";
    /// 99th percentile gap between streamed chunks, seconds.
    pub const INTER_TOKEN_LATENCY_P99: &str = "infer.inter_token_latency.p99";
    /// Largest gap between streamed chunks, seconds.
    pub const INTER_TOKEN_LATENCY_MAX: &str = "infer.inter_token_latency.max";
    /// Number of streamed chunks (SSE events / gRPC messages).
    pub const STREAM_CHUNKS: &str = "infer.stream.chunks";
    /// Outcome: see [`outcome`].
    pub const OUTCOME: &str = "infer.outcome";
    /// Where phase boundaries came from: `engine` or `derived`.
    pub const PHASE_SOURCE: &str = "infer.phase.source";
    /// Admission-queue length at arrival.
    pub const QUEUE_DEPTH: &str = "infer.queue.depth";
    /// Phase name on phase spans: `queue`, `prefill`, `decode`, `inference`, or one of the
    /// disaggregated sub-phases in [`crate::disagg`].
    pub const PHASE: &str = "infer.phase";
    /// Times the engine preempted (evicted and later re-scheduled) the request (int).
    pub const PREEMPTIONS: &str = "infer.preemptions";
    /// Name of the LoRA adapter that served the request, when one did.
    pub const LORA_ADAPTER: &str = "infer.lora.adapter";
    /// Outcome values.
    pub mod outcome {
        /// Completed normally.
        pub const OK: &str = "ok";
        /// Failed (handler error, 5xx, non-OK gRPC status, engine error).
        pub const ERROR: &str = "error";
        /// The client went away before the response completed.
        pub const CANCELLED: &str = "cancelled";
        /// Refused by admission control (429 / RESOURCE_EXHAUSTED).
        pub const REJECTED: &str = "rejected";

        /// The outcome an HTTP response status says, where it says one: 429 (the service's
        /// refusal) [`REJECTED`], 499 (the client went away) [`CANCELLED`], any other 4xx or
        /// 5xx [`ERROR`] (a request the service did not serve, such as a prompt over the
        /// context, must not count as an ok request of a tenth of a millisecond). The layer
        /// writes outcomes and the collector reads statuses by this one rule.
        pub fn of_http_status(code: i64) -> Option<&'static str> {
            match code {
                429 => Some(REJECTED),
                499 => Some(CANCELLED),
                c if c >= 400 => Some(ERROR),
                _ => None,
            }
        }

        /// The outcome a `grpc-status` code says, where it says one: RESOURCE_EXHAUSTED (8)
        /// [`REJECTED`], CANCELLED (1) [`CANCELLED`], any other non-OK code [`ERROR`].
        pub fn of_grpc_status(code: i64) -> Option<&'static str> {
            match code {
                0 => None,
                1 => Some(CANCELLED),
                8 => Some(REJECTED),
                _ => Some(ERROR),
            }
        }
    }
    /// Phase-source values.
    pub mod phase_source {
        /// The engine marked scheduled / first token itself.
        pub const ENGINE: &str = "engine";
        /// Derived from the admission queue and the response body.
        pub const DERIVED: &str = "derived";
    }
}

/// Sub-phases of a request served by disaggregated prefill and decode pools: the values of
/// `infer.phase` on phase spans, and the field names of the request record's sub-phases. They
/// follow SGLang's stage names and vLLM's span proposal where those fit
/// (docs/dialects-sglang.md has the mapping). In time order along time to first token:
/// routing → bootstrap → prefill queue → prefill → KV transfer → decode wait → first token; the
/// decode pool's own bootstrap runs beside the prefill side, and decode follows the first token.
pub mod disagg {
    /// Router: arrival → request forwarded to the chosen workers (SGLang `mini_lb_launch`).
    pub const ROUTING: &str = "routing";
    /// Prefill worker: bootstrap queue — handshake with the decode worker and wait for its KV
    /// pre-allocation (SGLang `prefill_bootstrap`).
    pub const BOOTSTRAP: &str = "bootstrap";
    /// Prefill worker: waiting queue → forward (SGLang `prefill_waiting`, vLLM `vllm_queue`).
    pub const PREFILL_QUEUE: &str = "prefill_queue";
    /// Prefill worker: the prefill forward, chunks included (SGLang `prefill_forward`,
    /// vLLM `vllm_prefill`).
    pub const PREFILL: &str = "prefill";
    /// Prefill → decode KV-cache transfer (SGLang `prefill_transfer_kv_cache`, vLLM
    /// `vllm_async_kv_transfer`, TensorRT-LLM `gen_ai.latency.kv_cache_transfer_time`).
    pub const KV_TRANSFER: &str = "kv_transfer";
    /// Decode worker: handshake and KV-memory allocation wait before it can receive
    /// (SGLang `decode_bootstrap`); concurrent with the prefill side.
    pub const DECODE_BOOTSTRAP: &str = "decode_bootstrap";
    /// Decode worker: KV received → scheduled into a decode batch (SGLang `decode_waiting`).
    pub const DECODE_WAIT: &str = "decode_wait";
    /// Decode worker: scheduled → first token emitted (SGLang's prebuilt `fake_output` step).
    pub const FIRST_TOKEN: &str = "first_token";
    /// Decode worker: first token → last token (SGLang `decode_loop`, vLLM `vllm_decode`).
    pub const DECODE: &str = "decode";
    /// Request-span attribute: which role of a disaggregated deployment emitted the span
    /// (`router`, `prefill`, `decode`).
    pub const ROLE: &str = "infer.disagg.role";
    /// Values of [`ROLE`].
    pub mod role {
        /// The router / load balancer in front of the pools.
        pub const ROUTER: &str = "router";
        /// A prefill worker.
        pub const PREFILL: &str = "prefill";
        /// A decode worker.
        pub const DECODE: &str = "decode";
    }
}

/// SGLang's request tracing (`--enable-trace` / `--trace-level`, module sglang/srt/tracing):
/// span naming, attributes and stage ("slice") names. docs/dialects-sglang.md#sglangs-span-model describes the tree.
pub mod sglang {
    /// Name prefix of the per-request root, `Bootstrap Room 0x…`.
    pub const ROOM_SPAN_PREFIX: &str = "Bootstrap Room ";
    /// What a per-role request span's name contains: `"{role} Req {first 8 chars of rid}"`.
    pub const REQUEST_SPAN_MARKER: &str = "Req ";
    /// Attribute of the room span: the bootstrap room, hex (`0x…`).
    pub const BOOTSTRAP_ROOM: &str = "bootstrap_room";
    /// Attribute of the per-role request span: the request id.
    pub const RID: &str = "rid";
    /// Attribute of a thread span: the thread's label (`Tokenizer`, `Scheduler`, …).
    pub const THREAD_LABEL: &str = "thread_label";
    /// Attribute of a thread span: its tensor-parallel rank (int), when it has one.
    pub const TP_RANK: &str = "tp_rank";
    /// Prompt tokens served from the prefix cache (int), SGLang's name on request spans
    /// (the GenAI conventions' is `gen_ai.usage.cache_read.input_tokens`).
    pub const USAGE_CACHED_TOKENS: &str = "gen_ai.usage.cached_tokens";
    /// Role prefixes of request span names in PD mode.
    pub mod role {
        /// Prefill side.
        pub const PREFILL: &str = "prefill";
        /// Decode side.
        pub const DECODE: &str = "decode";
        /// The router (mini load balancer).
        pub const ROUTER: &str = "router";
        /// The KV-cache sender of a transfer (mooncake): its own trace, not a request.
        pub const KV_SENDER: &str = "sender";
    }
    /// Stage (slice) names; the level at which SGLang emits each is in docs/dialects-sglang.md#sglangs-span-model.
    pub mod stage {
        /// Tokenizer: tokenization.
        pub const TOKENIZE: &str = "tokenize";
        /// Tokenizer → scheduler dispatch (older name).
        pub const DISPATCH: &str = "dispatch";
        /// Tokenizer → scheduler dispatch (newer name).
        pub const API_SERVER_DISPATCH: &str = "api_server_dispatch";
        /// Data-parallel controller dispatch (older name).
        pub const DC_DISPATCH: &str = "dc_dispatch";
        /// Data-parallel controller dispatch (newer name).
        pub const DPC_DISPATCH: &str = "dpc_dispatch";
        /// Scheduler: received → waiting queue.
        pub const REQUEST_PROCESS: &str = "request_process";
        /// Waiting queue → forward (queue time).
        pub const PREFILL_WAITING: &str = "prefill_waiting";
        /// The prefill forward (chunks nested inside).
        pub const PREFILL_FORWARD: &str = "prefill_forward";
        /// One chunk of a chunked prefill.
        pub const CHUNKED_PREFILL: &str = "chunked_prefill";
        /// One decode step (older versions: the decode loop).
        pub const DECODE_LOOP: &str = "decode_loop";
        /// Newer versions: the decode phase around the decode steps.
        pub const DECODE_FORWARD: &str = "decode_forward";
        /// PD prefill: received → bootstrap queue.
        pub const PREFILL_PREPARE: &str = "prefill_prepare";
        /// PD prefill: bootstrap queue → waiting queue (handshake with decode).
        pub const PREFILL_BOOTSTRAP: &str = "prefill_bootstrap";
        /// PD prefill: transfer queue → KV transfer done.
        pub const PREFILL_TRANSFER_KV_CACHE: &str = "prefill_transfer_kv_cache";
        /// PD decode: received → pre-allocation queue.
        pub const DECODE_PREPARE: &str = "decode_prepare";
        /// PD decode: pre-allocation queue → transfer queue (handshake, KV allocation wait).
        pub const DECODE_BOOTSTRAP: &str = "decode_bootstrap";
        /// PD decode: waiting queue → forward; unified mode (newer): prefill done → decode
        /// scheduled.
        pub const DECODE_WAITING: &str = "decode_waiting";
        /// PD decode: transfer queue → KV received.
        pub const DECODE_TRANSFERRED: &str = "decode_transferred";
        /// PD decode: the prebuilt step that emits the token the prefill side computed.
        pub const FAKE_OUTPUT: &str = "fake_output";
        /// PD decode: finished without decoding.
        pub const QUICK_FINISH: &str = "quick_finish";
        /// Router: arrival → requests sent to the prefill and decode servers.
        pub const MINI_LB_LAUNCH: &str = "mini_lb_launch";
        /// Router: waiting for both servers to answer.
        pub const WAIT_PD_FINISH: &str = "wait_pd_finish";
    }
}

/// TensorRT-LLM's disaggregated-serving span events (not kept by the collector's span model:
/// the `gen_ai.latency.kv_cache_transfer_time` attribute carries the same duration).
pub mod trtllm {
    /// Event: KV-cache transfer started.
    pub const KV_CACHE_TRANSFER_START: &str = "kv_cache_transfer_start";
    /// Event: KV-cache transfer ended.
    pub const KV_CACHE_TRANSFER_END: &str = "kv_cache_transfer_end";
}

/// Window statistics of GPU and host counters, on phase spans.
pub mod gpu {
    /// Mean GPU utilisation over the phase, 0–1.
    pub const UTILIZATION_MEAN: &str = "gpu.utilization.mean";
    /// Max GPU utilisation over the phase, 0–1.
    pub const UTILIZATION_MAX: &str = "gpu.utilization.max";
    /// Mean SM activity (Hopper GPM), 0–1.
    pub const SM_ACTIVITY_MEAN: &str = "gpu.sm.activity.mean";
    /// Max memory used, bytes.
    pub const MEMORY_USED_MAX: &str = "gpu.memory.used.max";
    /// Mean power, watts.
    pub const POWER_MEAN: &str = "gpu.power.mean";
    /// Device energy over the phase, joules.
    pub const ENERGY: &str = "gpu.energy";
    /// Energy attributed to this request by token share, joules (an estimate).
    pub const ENERGY_ATTRIBUTED: &str = "gpu.energy.attributed";
    /// Number of samples in the window.
    pub const SAMPLE_COUNT: &str = "gpu.sample.count";
    /// UUIDs of the devices sampled (string array).
    pub const UUIDS: &str = "gpu.uuids";
    /// Mean host CPU utilisation, 0–1.
    pub const HOST_CPU_UTILIZATION_MEAN: &str = "host.cpu.utilization.mean";
    /// Mean process CPU utilisation, 0–1.
    pub const PROCESS_CPU_UTILIZATION_MEAN: &str = "process.cpu.utilization.mean";
    /// Max process resident memory, bytes.
    pub const PROCESS_MEMORY_USAGE_MAX: &str = "process.memory.usage.max";
}

/// HTTP and RPC semantic-convention attributes.
pub mod net {
    /// HTTP method.
    pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
    /// Matched route template.
    pub const HTTP_ROUTE: &str = "http.route";
    /// HTTP status code (int).
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    /// Request path.
    pub const URL_PATH: &str = "url.path";
    /// Server host.
    pub const SERVER_ADDRESS: &str = "server.address";
    /// Server port (int).
    pub const SERVER_PORT: &str = "server.port";
    /// User agent.
    pub const USER_AGENT_ORIGINAL: &str = "user_agent.original";
    /// RPC system (`grpc`).
    pub const RPC_SYSTEM: &str = "rpc.system";
    /// RPC service.
    pub const RPC_SERVICE: &str = "rpc.service";
    /// RPC method.
    pub const RPC_METHOD: &str = "rpc.method";
    /// gRPC status code (int), from headers or trailers.
    pub const RPC_GRPC_STATUS_CODE: &str = "rpc.grpc.status_code";
    /// Error type on failure.
    pub const ERROR_TYPE: &str = "error.type";
}

/// Resource attributes.
pub mod resource {
    /// Service name.
    pub const SERVICE_NAME: &str = "service.name";
}

/// Metric instrument names the middleware emits, with units.
pub mod metric {
    /// Request duration histogram, s.
    pub const REQUEST_DURATION: &str = "gen_ai.server.request.duration";
    /// Time to first token histogram, s.
    pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
    /// Time per output token histogram, s.
    pub const TIME_PER_OUTPUT_TOKEN: &str = "gen_ai.server.time_per_output_token";
    /// Queue phase duration histogram, s.
    pub const QUEUE_DURATION: &str = "infer.server.queue.duration";
    /// Prefill phase duration histogram, s.
    pub const PREFILL_DURATION: &str = "infer.server.prefill.duration";
    /// Decode phase duration histogram, s.
    pub const DECODE_DURATION: &str = "infer.server.decode.duration";
    /// Token usage histogram, {token}, with `gen_ai.token.type`.
    pub const TOKEN_USAGE: &str = "infer.server.token.usage";
    /// Requests in flight, up-down counter.
    pub const ACTIVE_REQUESTS: &str = "infer.server.active_requests";
    /// Requests waiting in the admission queue, up-down counter.
    pub const QUEUE_SIZE: &str = "infer.server.queue.size";

    // The GenAI conventions' advisory buckets, each with a tail (and TPOT with a head): past its last bound a
    // Prometheus `histogram_quantile` reads that bound, so an overloaded server's TTFT p99 of
    // 15 s would read exactly 10 s. The tails reach what a queue in front of an
    // engine can make of a request.

    /// Buckets of `gen_ai.server.request.duration`: 0.01 doubling to 81.92 s (the conventions'),
    /// then on to 655.36 s.
    pub const REQUEST_DURATION_BUCKETS: [f64; 17] = [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
        163.84, 327.68, 655.36,
    ];
    /// Buckets of `gen_ai.server.time_to_first_token`: the conventions' 1 ms … 10 s, then 20,
    /// 40, 80, 160 and 320 s.
    pub const TTFT_BUCKETS: [f64; 21] = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 320.0,
    ];
    /// Buckets of `gen_ai.server.time_per_output_token`: 2.5, 5 and 7.5 ms (a fast decoder's
    /// token, which the conventions' first bucket would read as "under 10 ms"), the
    /// conventions' 10 ms … 2.5 s, then 5 and 10 s.
    pub const TPOT_BUCKETS: [f64; 18] = [
        0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
        2.5, 5.0, 10.0,
    ];
    /// Buckets of the phase-duration histograms: 0.001 doubling to 65.536 s, 81.92 s (the
    /// request duration's last), then 163.84, 327.68 and 655.36 s.
    pub const PHASE_DURATION_BUCKETS: [f64; 21] = [
        0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
        8.192, 16.384, 32.768, 65.536, 81.92, 163.84, 327.68, 655.36,
    ];
    /// Buckets of `infer.server.token.usage`: 1, 4, 16 … 67108864 (×4).
    pub const TOKEN_USAGE_BUCKETS: [f64; 14] = [
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ];
}

/// Hardware metric names (OpenTelemetry hardware conventions).
pub mod hw {
    /// GPU utilisation, 0–1, with `hw.gpu.task`.
    pub const GPU_UTILIZATION: &str = "hw.gpu.utilization";
    /// GPU memory used, bytes.
    pub const GPU_MEMORY_USAGE: &str = "hw.gpu.memory.usage";
    /// GPU memory total, bytes.
    pub const GPU_MEMORY_LIMIT: &str = "hw.gpu.memory.limit";
    /// Power, W.
    pub const POWER: &str = "hw.power";
    /// Energy, J (counter).
    pub const ENERGY: &str = "hw.energy";
    /// Temperature, °C.
    pub const TEMPERATURE: &str = "hw.temperature";
    /// Attribute: device id (GPU UUID).
    pub const ID: &str = "hw.id";
    /// Attribute: device type (`gpu`).
    pub const TYPE: &str = "hw.type";
    /// Attribute: device name.
    pub const NAME: &str = "hw.name";
    /// Attribute: vendor (`NVIDIA`).
    pub const VENDOR: &str = "hw.vendor";
    /// Attribute: GPU task (`general`).
    pub const GPU_TASK: &str = "hw.gpu.task";
    /// Attribute: sensor location.
    pub const SENSOR_LOCATION: &str = "hw.sensor_location";
}

/// Host and process metric names (OpenTelemetry system / process conventions), exported by the
/// host sampler of crates/gpu.
pub mod system {
    /// Host CPU utilisation, 0–1 (gauge).
    pub const CPU_UTILIZATION: &str = "system.cpu.utilization";
    /// Process CPU utilisation, 0–1 of the whole host (gauge).
    pub const PROCESS_CPU_UTILIZATION: &str = "process.cpu.utilization";
    /// Process resident memory, bytes (up-down counter).
    pub const PROCESS_MEMORY_USAGE: &str = "process.memory.usage";
    /// Host network bytes, with `network.io.direction` (counter).
    pub const NETWORK_IO: &str = "system.network.io";
    /// Process disk bytes, with `disk.io.direction` (counter).
    pub const PROCESS_DISK_IO: &str = "process.disk.io";
    /// Attribute: network direction (`receive` / `transmit`).
    pub const NETWORK_IO_DIRECTION: &str = "network.io.direction";
    /// Attribute: disk direction (`read` / `write`).
    pub const DISK_IO_DIRECTION: &str = "disk.io.direction";
}

/// TGI's span fields (Debug-formatted duration strings such as `"12.3ms"`).
pub mod tgi {
    /// Total request time.
    pub const TOTAL_TIME: &str = "total_time";
    /// Validation time.
    pub const VALIDATION_TIME: &str = "validation_time";
    /// Queue time.
    pub const QUEUE_TIME: &str = "queue_time";
    /// Inference time.
    pub const INFERENCE_TIME: &str = "inference_time";
    /// Time per token (includes prefill in TGI).
    pub const TIME_PER_TOKEN: &str = "time_per_token";
    /// Batch size on `batch` spans.
    pub const BATCH_SIZE: &str = "batch_size";
}

/// Prometheus names the collector exposes (all prefixed `infertrace_`).
pub mod prom {
    /// Prefix of every collector metric.
    pub const PREFIX: &str = "infertrace";
    /// Label: service.
    pub const LABEL_SERVICE: &str = "service";
    /// Label: model.
    pub const LABEL_MODEL: &str = "model";
    /// Label: operation.
    pub const LABEL_OPERATION: &str = "operation";
    /// Label: outcome.
    pub const LABEL_OUTCOME: &str = "outcome";
    /// Requests counter.
    pub const REQUESTS: &str = "requests";
    /// e2e histogram, s.
    pub const REQUEST_DURATION: &str = "request_duration_seconds";
    /// Queue histogram, s.
    pub const QUEUE_DURATION: &str = "queue_duration_seconds";
    /// Prefill histogram, s.
    pub const PREFILL_DURATION: &str = "prefill_duration_seconds";
    /// Decode histogram, s.
    pub const DECODE_DURATION: &str = "decode_duration_seconds";
    /// TTFT histogram, s.
    pub const TIME_TO_FIRST_TOKEN: &str = "time_to_first_token_seconds";
    /// TPOT histogram, s.
    pub const TIME_PER_OUTPUT_TOKEN: &str = "time_per_output_token_seconds";
    /// Tokens counter with `type`.
    pub const TOKENS: &str = "tokens";
    /// Requests meeting every SLO.
    pub const GOODPUT_REQUESTS: &str = "goodput_requests";
    /// Critical-path seconds per span name.
    pub const CRITICAL_PATH_SECONDS: &str = "critical_path_seconds";
    /// Disaggregated prefill/decode sub-phase histogram with `pool`, `worker`, `phase`, s.
    pub const DISAGG_PHASE_DURATION: &str = "disagg_phase_duration_seconds";
    /// GPU energy counter, J.
    pub const GPU_ENERGY_JOULES: &str = "gpu_energy_joules";
    /// Active alerts gauge with `alert`.
    pub const ALERTS_ACTIVE: &str = "alerts_active";
    /// Self-metric: spans received by receiver and outcome.
    pub const RECEIVER_SPANS: &str = "receiver_spans";
    /// Self-metric: spans dropped by reason.
    pub const DROPPED_SPANS: &str = "dropped_spans";
    /// Self-metric: traces being assembled.
    pub const TRACES_IN_FLIGHT: &str = "traces_in_flight";
    /// Self-metric: the grace period in use, seconds (`assembly.grace`, raised up to
    /// `assembly.max_grace` while spans arrive later than it).
    pub const ASSEMBLY_GRACE_SECONDS: &str = "assembly_grace_seconds";
    /// Self-metric: spans arriving after their trace completed.
    pub const LATE_SPANS: &str = "late_spans";
    /// Self-metric: spans received again while their trace was assembled (kept once).
    pub const DUPLICATE_SPANS: &str = "duplicate_spans";
    /// Self-metric: requests left out of the aggregates because a value cannot be true, by
    /// reason (`duration`, `tokens`).
    pub const IMPLAUSIBLE_REQUESTS: &str = "implausible_requests";
    /// Self-metric: spans exported by exporter and outcome.
    pub const EXPORTED_SPANS: &str = "exported_spans";
    /// Self-metric: series refused by the cardinality cap.
    pub const SERIES_OVERFLOW: &str = "series_overflow";
    /// Self-metric: rows written to the history store.
    pub const STORE_WRITES: &str = "store_writes";
    /// Self-metric: history-store items dropped, by reason (`queue_full`, `write_failed`).
    pub const STORE_DROPPED: &str = "store_dropped";
    /// Self-metric: completed traces analysed but not kept in the recent-trace ring (its
    /// admission rate, `api.recent_traces` per second, was used up).
    pub const RECENT_TRACES_NOT_KEPT: &str = "recent_traces_not_kept";
    /// Self-metric: requests of a re-opened trace (a request span arriving after its trace
    /// completed) not counted, because the trace's earlier part had left the recent-trace ring
    /// and the requests it counted could not be told apart from new ones.
    pub const REOPENED_REQUESTS_NOT_COUNTED: &str = "reopened_requests_not_counted";
    /// Self-metric: traces closed before their grace period ended to make room for new ones
    /// (`limits.max_traces_in_flight` reached).
    pub const TRACES_CLOSED_EARLY: &str = "traces_closed_early";
    /// Self-metric: strings (span names, service names, kept attribute values) cut to the
    /// longest text the collector keeps.
    pub const TEXTS_TRUNCATED: &str = "texts_truncated";
    /// Self-metric: idle KPI and Prometheus series reclaimed to make room under the series cap.
    pub const SERIES_RECLAIMED: &str = "series_reclaimed";
    /// Self-metric: requests refused, by receiver and reason (before anything was accepted).
    pub const REQUESTS_REFUSED: &str = "requests_refused";
    /// Self-metric (gauge): connections open, by `listener` (`otlp_grpc`, `otlp_http`, `api`).
    pub const CONNECTIONS_OPEN: &str = "connections_open";
    /// Self-metric: connections closed at once because the listener held its
    /// `connections.max`, by `listener`.
    pub const CONNECTIONS_REFUSED: &str = "connections_refused";
    /// Self-metric: failed accepts, by `listener` — nearly always the process out of file
    /// descriptors (`ulimit -n`), while new connections wait in the kernel's backlog.
    pub const ACCEPT_ERRORS: &str = "accept_errors";
    /// Self-metric: connections the collector closed, by `listener` and `reason`
    /// (`idle_timeout`, `header_timeout`, `keepalive_timeout`, `tls_handshake`, `shutdown`).
    pub const CONNECTIONS_CLOSED: &str = "connections_closed";
    /// Self-metric: requests refused by authentication or the Host allowlist, by listener
    /// (`otlp_grpc`, `otlp_http`, `api`) and reason (`missing_token`, `unknown_token`,
    /// `insufficient_scope`, `host_not_allowed`).
    pub const AUTH_FAILURES: &str = "auth_failures";
    /// Self-metric: reloads on SIGHUP, by `what` (`tokens`, `tls_otlp_grpc`, `tls_otlp_http`,
    /// `tls_api`) and `outcome` (`ok`, or `failed`: the previous tokens or certificate stay in
    /// force).
    pub const RELOADS: &str = "reloads";
    /// Self-metric: forward attempts (one per export call to the downstream), by outcome
    /// (`ok`, `timeout`, `retryable`, `permanent`).
    pub const FORWARD_ATTEMPTS: &str = "forward_attempts";
    /// Self-metric: POSTs of alerts to Alertmanager, by outcome (`ok`, or `failed`: refused,
    /// unreachable, no answer within 10 s, or left out while Alertmanager was behind).
    pub const ALERTMANAGER_POSTS: &str = "alertmanager_posts";
    /// Self-metric: spans accepted for forwarding and not yet exported or given up (queued,
    /// being batched, or being sent).
    pub const FORWARD_PENDING_SPANS: &str = "forward_pending_spans";
    /// Self-metric: request-body bytes of the spans of [`FORWARD_PENDING_SPANS`].
    pub const FORWARD_PENDING_BYTES: &str = "forward_pending_bytes";
    /// Self-metric (gauge): bytes held in the memory limiter, by `part`: `data` (requests
    /// being read and decoded, spans and traces buffered, the forward queue), `aggregates` (KPI
    /// series, critical-path windows, Prometheus label sets) and `recent_traces` (the ring
    /// behind `/api/traces/{id}`); set at every assembly tick.
    pub const MEMORY_RESERVED_BYTES: &str = "memory_reserved_bytes";
    /// Self-metric (gauge): `limits.memory_limit_bytes`, for ratios against
    /// [`MEMORY_RESERVED_BYTES`].
    pub const MEMORY_LIMIT_BYTES: &str = "memory_limit_bytes";
    /// Self-metric (gauge): the collector process's resident memory at the last assembly tick
    /// (`limits.watch_resident_memory`).
    pub const RESIDENT_MEMORY_BYTES: &str = "resident_memory_bytes";
    /// Self-metric: assembly ticks at which the resident memory was near the limit's bound and
    /// the allocator was told to return the freed memory it keeps.
    pub const MEMORY_RETURNED_TICKS: &str = "memory_returned_ticks";
}

#[cfg(test)]
mod tests {
    use super::infer::outcome::*;

    #[test]
    fn statuses_say_the_outcome_the_layer_writes_and_the_collector_reads() {
        for (code, said) in [
            (200, None),
            (304, None),
            (400, Some(ERROR)),
            (404, Some(ERROR)),
            (429, Some(REJECTED)),
            (499, Some(CANCELLED)),
            (500, Some(ERROR)),
            (503, Some(ERROR)),
        ] {
            assert_eq!(of_http_status(code), said, "HTTP {code}");
        }
        for (code, said) in [
            (0, None),
            (1, Some(CANCELLED)),
            (3, Some(ERROR)),
            (8, Some(REJECTED)),
            (13, Some(ERROR)),
            (14, Some(ERROR)),
        ] {
            assert_eq!(of_grpc_status(code), said, "grpc-status {code}");
        }
    }
}
