//! [`TokenText`]: deterministic filler text for generated tokens (no allocation per token).

/// Words tokens are drawn from; each token is one word with a leading space.
const VOCABULARY: [&str; 32] = [
    " the",
    " model",
    " token",
    " batch",
    " queue",
    " prefill",
    " decode",
    " latency",
    " request",
    " stream",
    " kernel",
    " memory",
    " cache",
    " attention",
    " layer",
    " weight",
    " tensor",
    " span",
    " trace",
    " time",
    " first",
    " output",
    " input",
    " server",
    " client",
    " engine",
    " step",
    " sequence",
    " prompt",
    " context",
    " budget",
    " signal",
];

/// A per-request word generator (SplitMix64 over a seed).
#[derive(Clone, Debug)]
pub(crate) struct TokenText {
    state: u64,
}

impl TokenText {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub(crate) fn next_word(&mut self) -> &'static str {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        VOCABULARY[(z % VOCABULARY.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_words() {
        let mut a = TokenText::new(7);
        let mut b = TokenText::new(7);
        let mut c = TokenText::new(8);
        let wa: Vec<_> = (0..20).map(|_| a.next_word()).collect();
        let wb: Vec<_> = (0..20).map(|_| b.next_word()).collect();
        let wc: Vec<_> = (0..20).map(|_| c.next_word()).collect();
        assert_eq!(wa, wb);
        assert_ne!(wa, wc);
    }
}
