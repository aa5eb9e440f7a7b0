//! gRPC status codes: what the gRPC receiver answers in `grpc-status`, and what the OTLP/HTTP
//! receiver puts in its `google.rpc.Status` error bodies.

use crate::auth::Refusal;

/// The gRPC status codes the receivers answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Code {
    Ok = 0,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The code of an authentication refusal: no or an unknown token is `UNAUTHENTICATED`, a
    /// token without the scope `PERMISSION_DENIED`.
    pub(super) fn of_refusal(refusal: Refusal) -> Self {
        match refusal {
            Refusal::InsufficientScope => Self::PermissionDenied,
            Refusal::MissingToken | Refusal::UnknownToken => Self::Unauthenticated,
        }
    }
}
