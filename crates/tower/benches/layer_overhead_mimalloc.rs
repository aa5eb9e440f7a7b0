//! `layer_overhead` with mimalloc as the global allocator instead of the system's (glibc) malloc:
//! the same variants, exporter and summary. The layer's spans are allocated on the request
//! thread and freed on the batch processor's export thread; glibc serves that pattern through
//! its arena locks (and, for the request span's ~2 KB attribute vector, its large-block path),
//! mimalloc through per-thread heaps with deferred cross-thread frees. The collector's binaries
//! use mimalloc; a server using the layer chooses its own allocator.
//!
//! Run: `cargo bench -p infertrace-tower --bench layer_overhead_mimalloc -- 'request/…'`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "layer_overhead.rs"]
mod layer_overhead;

fn main() {
    layer_overhead::main();
}
