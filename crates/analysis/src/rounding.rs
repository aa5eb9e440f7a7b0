//! `f64` → `i32` bucket keys rounded down or up without a libm call.
//!
//! Without SSE4.1 (not in the x86-64 baseline the release is built for) `f64::floor` and
//! `f64::ceil` are calls into libm; the KPI sketches and the critical-path windows round a
//! logarithm per recorded value, several per request. These give exactly
//! `x.floor() as i32` and `x.ceil() as i32` (saturating, NaN → 0) with a truncation and a
//! compare.

/// `x.floor() as i32`.
#[inline]
pub(crate) fn floor_to_i32(x: f64) -> i32 {
    let t = x as i32; // truncates toward zero, saturating
    if (t as f64) > x {
        t.saturating_sub(1)
    } else {
        t
    }
}

/// `x.ceil() as i32`.
#[inline]
pub(crate) fn ceil_to_i32(x: f64) -> i32 {
    let t = x as i32;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edges_agree_with_libm() {
        let edges = [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.0,
            -1.0,
            1.5,
            -1.5,
            2.0 - f64::EPSILON,
            -2.0 + f64::EPSILON,
            i32::MAX as f64,
            i32::MAX as f64 + 0.5,
            i32::MAX as f64 + 1.0,
            i32::MIN as f64,
            i32::MIN as f64 - 0.5,
            i32::MIN as f64 - 1.0,
            1e300,
            -1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
        ];
        for x in edges {
            assert_eq!(floor_to_i32(x), x.floor() as i32, "floor {x}");
            assert_eq!(ceil_to_i32(x), x.ceil() as i32, "ceil {x}");
        }
    }

    proptest! {
        #[test]
        fn any_value_agrees_with_libm(x in any::<f64>(), small in -3e9f64..3e9) {
            for x in [x, small, small.fract()] {
                prop_assert_eq!(floor_to_i32(x), x.floor() as i32, "floor {}", x);
                prop_assert_eq!(ceil_to_i32(x), x.ceil() as i32, "ceil {}", x);
            }
        }
    }
}
