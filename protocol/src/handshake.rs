//! The [`Hello`] exchange that opens every connection to the driver, both ends of it,
//! written once: the executor and the standalone worker [`greet`], the driver
//! [`welcome`]s. Still no sockets here: each side brings its stream and gets it back
//! framed for the messages that follow.
//!
//! The driver checks that the peer is a Flint process (magic), of this protocol version,
//! and knows the cluster secret when there is one; the secret is compared in constant
//! time, so that a caller cannot learn it byte by byte from how long a refusal takes.

use futures_util::{SinkExt, StreamExt};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use crate::codec::FrameCodec;
use crate::messages::{Hello, HelloReply, PROTOCOL_VERSION};

/// Why a hello did not lead to a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The driver said no (bad secret, another version), or, on the driver's side, the
    /// reason it said no. Retrying will not help.
    #[error("{0}")]
    Refused(String),
    /// The connection broke or spoke something else before the exchange was done.
    #[error("hello: {0}")]
    Broken(String),
}

/// The connecting side: sends the hello with `secret` and waits for the driver's answer;
/// on acceptance the stream, framed to read `In` and write `Out`.
pub async fn greet<T, In, Out>(
    io: T,
    secret: Option<String>,
) -> Result<Framed<T, FrameCodec<In, Out>>, HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = Framed::new(io, FrameCodec::<HelloReply, Hello>::default());
    let broken = |e: String| HelloError::Broken(e);
    hello
        .send(Hello::new(secret))
        .await
        .map_err(|e| broken(e.to_string()))?;
    match hello.next().await {
        Some(Ok(HelloReply {
            accepted: Ok(()), ..
        })) => Ok(hello.map_codec(|c| c.retype())),
        Some(Ok(HelloReply {
            accepted: Err(reason),
            ..
        })) => Err(HelloError::Refused(reason)),
        Some(Err(e)) => Err(broken(e.to_string())),
        None => Err(broken("the driver closed the connection".into())),
    }
}

/// The driver's side: reads the peer's hello, answers it, and on acceptance hands back
/// the stream framed to read `In` and write `Out`. A refused peer has been told why
/// before this returns [`HelloError::Refused`].
pub async fn welcome<T, In, Out>(
    io: T,
    secret: Option<&str>,
) -> Result<Framed<T, FrameCodec<In, Out>>, HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = Framed::new(io, FrameCodec::<Hello, HelloReply>::default());
    let greeting = match hello.next().await {
        Some(Ok(greeting)) => greeting,
        Some(Err(e)) => return Err(HelloError::Broken(format!("bad hello: {e}"))),
        None => return Err(HelloError::Broken("closed before hello".into())),
    };
    let verdict = check_hello(&greeting, secret);
    hello
        .send(HelloReply {
            version: PROTOCOL_VERSION,
            accepted: verdict.clone(),
        })
        .await
        .map_err(|e| HelloError::Broken(e.to_string()))?;
    verdict.map_err(HelloError::Refused)?;
    Ok(hello.map_codec(|c| c.retype()))
}

/// Whether `hello` may go on to register; the reason it may not, for both logs.
pub fn check_hello(hello: &Hello, secret: Option<&str>) -> Result<(), String> {
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

    /// Both ends over an in-memory pipe: what one side is told is what the other decided.
    async fn exchange(
        given: Option<&str>,
        required: Option<&str>,
    ) -> (Result<(), HelloError>, Result<(), HelloError>) {
        let (client, server) = tokio::io::duplex(4096);
        let given = given.map(str::to_owned);
        let (greeted, welcomed) = tokio::join!(
            greet::<_, HelloReply, Hello>(client, given),
            welcome::<_, Hello, HelloReply>(server, required),
        );
        (greeted.map(drop), welcomed.map(drop))
    }

    #[tokio::test]
    async fn both_ends_agree_on_acceptance_and_on_the_reason_for_a_refusal() {
        assert_eq!(exchange(Some("s"), Some("s")).await, (Ok(()), Ok(())));
        assert_eq!(exchange(None, None).await, (Ok(()), Ok(())));
        let refused = HelloError::Refused("wrong cluster secret".into());
        assert_eq!(
            exchange(Some("x"), Some("s")).await,
            (Err(refused.clone()), Err(refused))
        );
        let (greeted, _) = exchange(None, Some("s")).await;
        assert_eq!(
            greeted,
            Err(HelloError::Refused(
                "this driver requires a cluster secret".into()
            ))
        );
    }

    #[tokio::test]
    async fn a_peer_that_hangs_up_is_broken_not_refused() {
        let (client, server) = tokio::io::duplex(4096);
        drop(server);
        let greeted = greet::<_, HelloReply, Hello>(client, None).await.map(drop);
        assert!(matches!(greeted, Err(HelloError::Broken(_))), "{greeted:?}");
        let (client, server) = tokio::io::duplex(4096);
        drop(client);
        let welcomed = welcome::<_, Hello, HelloReply>(server, None)
            .await
            .map(drop);
        assert!(
            matches!(welcomed, Err(HelloError::Broken(_))),
            "{welcomed:?}"
        );
    }
}
