//! Anything but a WASI guest (the host running unit tests, wasm32-unknown-unknown):
//! there is no executor to send through.

use super::{Error, Request, Response};

/// Never made: no request is ever under way here.
pub(crate) enum Sent {}

pub(crate) fn send(_request: &Request) -> Result<Sent, Error> {
    Err(Error::Unsupported)
}

impl Sent {
    pub(crate) fn take(self) -> Result<Response, Error> {
        match self {}
    }
}
