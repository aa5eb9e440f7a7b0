//! [`TraceView`]: one trace's spans with the lookups the dialects need (by id, children,
//! ancestors, descendants).

use foldhash::{HashMap, HashMapExt};

use crate::trace::{Span, SpanId};

/// One trace's spans with the lookups the dialects need. Small traces are scanned linearly
/// (no allocation); traces over [`TraceView::INDEX_THRESHOLD`] spans get an id index, so TGI
/// traces with one `infer` span per decode step stay linear-time.
pub struct TraceView<'a> {
    /// The spans.
    pub spans: &'a [Span],
    by_id: Option<HashMap<SpanId, usize>>,
}

impl<'a> TraceView<'a> {
    /// Traces longer than this get an id index.
    pub const INDEX_THRESHOLD: usize = 24;

    /// A view of one trace's spans.
    pub fn new(spans: &'a [Span]) -> Self {
        let by_id = (spans.len() > Self::INDEX_THRESHOLD).then(|| {
            let mut map = HashMap::with_capacity(spans.len());
            for (i, s) in spans.iter().enumerate() {
                map.entry(s.span_id).or_insert(i);
            }
            map
        });
        Self { spans, by_id }
    }

    /// The span with this id.
    pub fn get(&self, id: SpanId) -> Option<&'a Span> {
        match &self.by_id {
            Some(map) => map.get(&id).map(|&i| &self.spans[i]),
            None => self.spans.iter().find(|s| s.span_id == id),
        }
    }

    /// The direct children of `span`.
    pub fn children(&self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'a {
        let id = span.span_id;
        self.spans
            .iter()
            .filter(move |s| s.parent_span_id == Some(id) && s.span_id != id)
    }

    /// The ancestors of `span`, nearest first (cycle-safe).
    pub fn ancestors<'v>(&'v self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'v {
        let view = self;
        let mut next = span.parent_span_id;
        let mut left = self.spans.len();
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let parent = view.get(next?)?;
            next = parent.parent_span_id;
            Some(parent)
        })
    }

    /// True when `a` is a (strict) ancestor of `b`.
    pub fn is_ancestor(&self, a: &Span, b: &'a Span) -> bool {
        if b.parent_span_id.is_none() {
            return false;
        }
        self.ancestors(b).any(|s| s.span_id == a.span_id)
    }

    /// The (strict) descendants of `span`.
    pub fn descendants<'v>(&'v self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'v {
        let view = self;
        self.spans
            .iter()
            .filter(move |s| s.span_id != span.span_id && view.is_ancestor(span, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::extract_requests;
    use crate::dialect::test_spans::span;

    #[test]
    fn ancestors_are_nearest_first_and_cycles_end() {
        for n in [4u8, 40] {
            // A chain 1 ← 2 ← … ← n, with and without the id index.
            let mut spans: Vec<Span> = (1..=n).map(|i| span(i, (i > 1).then(|| i - 1))).collect();
            let view = TraceView::new(&spans);
            assert_eq!(
                view.by_id.is_some(),
                n as usize > TraceView::INDEX_THRESHOLD
            );
            let last = &spans[n as usize - 1];
            let names: Vec<&str> = view.ancestors(last).map(|s| s.name.as_str()).collect();
            assert_eq!(names.len(), n as usize - 1);
            assert_eq!(names[0], format!("s{}", n - 1));
            assert!(view.is_ancestor(&spans[0], last));
            assert!(!view.is_ancestor(last, &spans[0]));
            assert_eq!(view.descendants(&spans[0]).count(), n as usize - 1);
            // Close the loop: 1's parent is n. Walks must still end.
            spans[0].parent_span_id = Some(SpanId([n; 8]));
            let view = TraceView::new(&spans);
            assert!(view.ancestors(&spans[0]).count() <= spans.len());
            assert!(extract_requests(&spans).is_empty());
        }
    }
}
