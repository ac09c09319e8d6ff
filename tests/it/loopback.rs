//! A tiny HTTP/1.1 server on `127.0.0.1:0` serving fixed bodies by path: the stand-in for a
//! package registry (npm packuments and tarballs, a pip "simple" index and its wheels, a
//! crate index, a Go module proxy, a git remote over git's dumb HTTP) and for the hosts the
//! network proxy allows or refuses. One request per connection. [`tls_front`] puts TLS in
//! front of it (or of the mock hub).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running server; it stops when dropped.
pub(crate) struct Loopback {
    pub addr: SocketAddr,
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    hits: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Loopback {
    /// Serve what `files` makes of the server's URL (path → body); anything else is a 404.
    pub(crate) async fn serve(files: impl FnOnce(&str) -> HashMap<String, Vec<u8>>) -> Loopback {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let files = Arc::new(Mutex::new(files(&format!("http://{addr}"))));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (files2, hits2) = (files.clone(), hits.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let files = files2.clone();
                let hits = hits2.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf);
                    let target = head.split_whitespace().nth(1).unwrap_or("/");
                    // A proxied request names the whole URL: serve by its path.
                    let path = match target.split_once("://") {
                        Some((_, rest)) => rest.find('/').map(|i| &rest[i..]).unwrap_or("/"),
                        None => target,
                    };
                    let path = path.split('?').next().unwrap_or(path);
                    hits.lock().unwrap().push(path.to_string());
                    let body = files.lock().unwrap().get(path).cloned();
                    let reply = match body {
                        Some(body) => {
                            let ctype = if path.ends_with('/') {
                                "text/html"
                            } else if path.ends_with(".tgz") || path.ends_with(".whl") {
                                "application/octet-stream"
                            } else {
                                "application/json"
                            };
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: max-age=86400\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
                    };
                    let _ = s.write_all(&reply).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Loopback {
            addr,
            files,
            hits,
            task,
        }
    }

    /// Stop serving `path` (404 from now on).
    pub(crate) fn remove(&self, path: &str) {
        self.files.lock().unwrap().remove(path);
    }

    /// The paths asked for so far.
    pub(crate) fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// The test CA (`tests/it/fixtures/ca.pem`) that signed [`tls_front`]'s certificate.
pub(crate) fn test_ca() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/ca.pem")
}

/// A TLS terminator on 127.0.0.1:0 (test certificate for `127.0.0.1` and `localhost`
/// signed by [`test_ca`]) in front of `upstream`. Returns its port and a counter of failed
/// TLS handshakes.
pub(crate) async fn tls_front(upstream: SocketAddr) -> (u16, Arc<AtomicU32>) {
    use tokio_rustls::rustls;
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures");
    let certs: Vec<_> =
        rustls_pemfile::certs(&mut std::fs::read(fx.join("server.pem")).unwrap().as_slice())
            .collect::<Result<_, _>>()
            .unwrap();
    let key =
        rustls_pemfile::private_key(&mut std::fs::read(fx.join("server.key")).unwrap().as_slice())
            .unwrap()
            .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let failures = Arc::new(AtomicU32::new(0));
    let f = failures.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let f = f.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(mut tls) => {
                        if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                        }
                    }
                    Err(_) => {
                        f.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (port, failures)
}
