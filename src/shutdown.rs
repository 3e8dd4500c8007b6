//! How a long-running command learns it should stop. Its own module, not the crate
//! root's, so that the commands which wait on it (`flint dev`, `flint worker`) depend
//! on nothing above them.

/// Resolves on the first Ctrl-C or SIGTERM; a second one exits at once. The handlers
/// are installed when this is called, not when the future is first polled: a SIGTERM
/// that arrives while an executor is still registering must stop it cleanly too.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            eprintln!("flint: second signal, exiting now");
            std::process::exit(130);
        });
    }
}
