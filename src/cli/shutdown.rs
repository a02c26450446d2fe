//! One shutdown signal, fanned out: the first SIGTERM/SIGINT drains, a second one exits at once.

use tokio::{signal::unix, sync::watch};

/// Returns a receiver that flips to `true` on the first signal.
pub fn on_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            unix::signal(unix::SignalKind::terminate()),
            unix::signal(unix::SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal received; draining (send again to exit at once)");
        let _ = tx.send(true);
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    rx
}
