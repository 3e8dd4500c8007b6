//! The first frame of an executor's connection: a Flint executor (magic), of this
//! protocol version, with the cluster secret when the driver has one (compared in
//! constant time, so a caller cannot learn it byte by byte from refusal times).

use flint_protocol::{Hello, PROTOCOL_VERSION};
use subtle::ConstantTimeEq;

/// Whether `hello` may go on to register; the reason it may not, for the log.
pub(super) fn check_hello(hello: &Hello, secret: Option<&str>) -> Result<(), String> {
    if hello.magic != Hello::MAGIC {
        return Err("not a Flint executor (bad magic)".into());
    }
    if hello.version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version mismatch: executor speaks {}, driver speaks {PROTOCOL_VERSION}",
            hello.version
        ));
    }
    match (secret, hello.secret.as_deref()) {
        (Some(expected), Some(given))
            if bool::from(expected.as_bytes().ct_eq(given.as_bytes())) =>
        {
            Ok(())
        }
        (Some(_), Some(_)) => Err("wrong cluster secret".into()),
        (Some(_), None) => Err("this driver requires a cluster secret".into()),
        (None, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_checks_magic_version_and_secret() {
        assert!(check_hello(&Hello::new(None), None).is_ok());
        assert!(check_hello(&Hello::new(Some("s".into())), Some("s")).is_ok());
        let wrong = check_hello(&Hello::new(Some("x".into())), Some("s")).unwrap_err();
        assert!(wrong.contains("wrong cluster secret"));
        let missing = check_hello(&Hello::new(None), Some("s")).unwrap_err();
        assert!(missing.contains("requires a cluster secret"));
        let mut old = Hello::new(None);
        old.version = PROTOCOL_VERSION + 1;
        assert!(
            check_hello(&old, None)
                .unwrap_err()
                .contains("version mismatch")
        );
        let mut alien = Hello::new(None);
        alien.magic = *b"HTTP/";
        assert!(check_hello(&alien, None).unwrap_err().contains("magic"));
    }
}
