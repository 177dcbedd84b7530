//! The `throttle-rls` binary run with exactly the environment a test
//! gives it, its log lines read as they come.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;

pub const BIN: &str = env!("CARGO_BIN_EXE_throttle-rls");

/// A port free now for the binary to listen on. Taken below Linux's
/// ephemeral range (32768–60999), where the outgoing connections of tests
/// running beside this one draw their ports: a port of that range found free
/// here could be a client's before the binary binds it ("Address already in
/// use"). Each test process walks its own stretch of 20000–31999.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let stretch = std::process::id() % 1000 * 12;
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(20_000 + (stretch + n) % 12_000).unwrap_or(20_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000–31999")
}

/// A running binary; killed on drop.
pub struct Proc {
    child: Child,
    rx: mpsc::UnboundedReceiver<String>,
    /// Every stderr line read so far.
    pub lines: Vec<String>,
}

impl Proc {
    /// Starts the binary with `env` only (nothing inherited).
    pub fn spawn(env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(BIN)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            rx,
            lines: Vec::new(),
        }
    }

    /// The first line that satisfies `what`, reading on until one does
    /// (at most 30 s).
    pub async fn line(&mut self, what: impl Fn(&str) -> bool) -> String {
        if let Some(l) = self.lines.iter().find(|l| what(l)) {
            return l.clone();
        }
        self.next_line(what).await
    }

    /// The next line not read yet that satisfies `what` (at most 30 s).
    pub async fn next_line(&mut self, what: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(deadline, self.rx.recv()).await;
            match line {
                Ok(Some(line)) => {
                    self.lines.push(line.clone());
                    if what(&line) {
                        return line;
                    }
                }
                Ok(None) => panic!("the binary exited; it said:\n{}", self.lines.join("\n")),
                Err(_) => panic!(
                    "no such line within 30 s; it said:\n{}",
                    self.lines.join("\n")
                ),
            }
        }
    }

    /// The lines that came so far, without waiting.
    pub fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.rx.try_recv() {
            self.lines.push(line);
        }
        &self.lines
    }

    /// SIGTERM, then the exit status (at most 30 s).
    #[cfg(unix)]
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let kill = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        // The log ends when the process does.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.lines.push(line);
        }
        self.child.wait().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/healthcheck` answers 200 (polled, at most 30 s).
pub async fn until_healthy(addr: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok()
            && crate::support::http(addr, "GET", "/healthcheck", "")
                .await
                .0
                == 200
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not healthy within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
