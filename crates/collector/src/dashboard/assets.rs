//! The dashboard's static files, embedded in the binary at build time.
//!
//! Cache policy: the page and its own script and style are small and change with every release,
//! so they are served with `Cache-Control: no-cache` and a strong `ETag` (a hash of the content),
//! answered with `304 Not Modified` when the browser already has them. The vendored chart
//! library's file names carry its version, so they are `immutable` for a year.

use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Version of the vendored uPlot (its file names under `/assets/vendor/` carry it).
#[cfg(test)]
pub const UPLOT_VERSION: &str = "1.6.32";

/// `Cache-Control` of the page and its own files.
pub const REVALIDATE: &str = "no-cache";
/// `Cache-Control` of versioned vendor files.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// `Content-Security-Policy` of every dashboard file: scripts, styles and images from this
/// origin only (no inline script or style attribute: positions are set through the CSSOM),
/// `fetch` to this origin only, no plug-ins, no `<base>`, no form submission, and no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// Headers every dashboard response carries (besides `Cache-Control`, `ETag`, type): the CSP,
/// no framing for older browsers, no MIME sniffing, no `Referer` leaving the page.
pub const SECURITY_HEADERS: [(header::HeaderName, &str); 4] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
];

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// Path under `/assets/` (the page itself is `index.html`, served at `/`).
    pub path: &'static str,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// `Cache-Control`.
    pub cache_control: &'static str,
    /// The bytes.
    pub body: &'static [u8],
}

/// Every embedded file.
pub static ASSETS: &[Asset] = &[
    Asset {
        path: "index.html",
        content_type: "text/html; charset=utf-8",
        cache_control: REVALIDATE,
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        path: "dashboard.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: REVALIDATE,
        body: include_bytes!("assets/dashboard.js"),
    },
    Asset {
        path: "dashboard.css",
        content_type: "text/css; charset=utf-8",
        cache_control: REVALIDATE,
        body: include_bytes!("assets/dashboard.css"),
    },
    Asset {
        path: "favicon.svg",
        content_type: "image/svg+xml",
        cache_control: REVALIDATE,
        body: include_bytes!("assets/favicon.svg"),
    },
    Asset {
        path: "vendor/uPlot-1.6.32.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: IMMUTABLE,
        body: include_bytes!("assets/vendor/uPlot.iife.min.js"),
    },
    Asset {
        path: "vendor/uPlot-1.6.32.min.css",
        content_type: "text/css; charset=utf-8",
        cache_control: IMMUTABLE,
        body: include_bytes!("assets/vendor/uPlot.min.css"),
    },
    Asset {
        path: "vendor/uPlot.LICENSE.txt",
        content_type: "text/plain; charset=utf-8",
        cache_control: REVALIDATE,
        body: include_bytes!("assets/vendor/uPlot.LICENSE"),
    },
];

/// The embedded file at `path` (relative to `/assets/`).
#[cfg(test)]
pub fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// FNV-1a 64 of the body: a stable, content-derived validator.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The strong `ETag` of the asset at `index` in [`ASSETS`] (computed once).
fn etag(index: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{:016x}\"", fnv1a(a.body)))
            .collect()
    });
    tags.get(index).map(String::as_str).unwrap_or("\"0\"")
}

/// Whether `If-None-Match` names `tag` (or is `*`).
fn matches(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == tag || t == "*")
}

/// The response for the asset at `path`, honouring `If-None-Match`; 404 when unknown.
pub fn respond(path: &str, request_headers: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|a| a.path == path) else {
        let mut headers = HeaderMap::new();
        for (name, value) in SECURITY_HEADERS {
            headers.insert(name, HeaderValue::from_static(value));
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return (StatusCode::NOT_FOUND, headers, "no such dashboard asset").into_response();
    };
    let asset = &ASSETS[index];
    let tag = etag(index);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(asset.cache_control),
    );
    if let Ok(v) = HeaderValue::from_str(tag) {
        headers.insert(header::ETAG, v);
    }
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if matches(request_headers, tag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    (StatusCode::OK, headers, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_present_and_typed() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.path);
            assert!(a.content_type.contains('/'), "{}", a.path);
        }
        let page = std::str::from_utf8(find("index.html").unwrap().body).unwrap();
        // Every asset the page links to is embedded.
        for link in page.split("/assets/").skip(1) {
            let path = &link[..link.find('"').unwrap()];
            assert!(find(path).is_some(), "index.html links to missing {path}");
        }
        assert!(find("vendor/uPlot.LICENSE.txt").is_some());
        assert!(
            find(&format!("vendor/uPlot-{UPLOT_VERSION}.iife.min.js")).is_some(),
            "vendor file names carry UPLOT_VERSION"
        );
    }

    #[test]
    fn etag_round_trip_gives_304() {
        let r = respond("dashboard.js", &HeaderMap::new());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert_eq!(r.headers()[header::CACHE_CONTROL], REVALIDATE);
        let tag = r.headers()[header::ETAG].clone();
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(
            respond("dashboard.js", &h).status(),
            StatusCode::NOT_MODIFIED
        );
        let mut other = HeaderMap::new();
        other.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"x\", \"y\""),
        );
        assert_eq!(respond("dashboard.js", &other).status(), StatusCode::OK);
        assert_eq!(respond("nope.js", &h).status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn every_file_carries_the_security_headers() {
        for a in ASSETS {
            let r = respond(a.path, &HeaderMap::new());
            for (name, value) in SECURITY_HEADERS {
                assert_eq!(r.headers()[&name], value, "{} {name}", a.path);
            }
        }
        let csp = CONTENT_SECURITY_POLICY;
        assert!(csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe-inline"));
        // The CSP allows no inline script, style element or style attribute: none is served.
        for a in ASSETS.iter().filter(|a| !a.path.starts_with("vendor/")) {
            let text = String::from_utf8_lossy(a.body);
            for inline in [
                "<script>",
                "<style",
                " style=\"",
                "onclick=",
                "onload=",
                "javascript:",
            ] {
                assert!(!text.contains(inline), "{} has inline {inline:?}", a.path);
            }
        }
    }

    #[test]
    fn vendor_files_are_immutable() {
        let r = respond("vendor/uPlot-1.6.32.min.css", &HeaderMap::new());
        assert_eq!(r.headers()[header::CACHE_CONTROL], IMMUTABLE);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/css; charset=utf-8");
    }

    #[test]
    fn fnv_known_value() {
        // FNV-1a 64 of "a" (reference value from the FNV specification).
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
