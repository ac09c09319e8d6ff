//! The periodic `resource_report`: host CPU and RAM from `/proc`, VRAM from Ollama `/api/ps`.

use std::time::Duration;

use crate::hub::proto::Outbound;

/// CPU counters from `/proc/stat` (first line), to compute usage between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    idle: u64,
    total: u64,
}

/// Samples host resources; keeps the previous CPU sample so usage is over the interval.
#[derive(Debug, Default)]
pub struct ResourceSampler {
    last_cpu: Option<CpuSample>,
    http: Option<reqwest::Client>,
    ollama_url: Option<String>,
}

impl ResourceSampler {
    /// A sampler; with `ollama_url` it also asks Ollama for the VRAM its models hold.
    pub fn new(ollama_url: Option<String>) -> ResourceSampler {
        let http = ollama_url.as_ref().and_then(|_| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .ok()
        });
        ResourceSampler {
            last_cpu: None,
            http,
            ollama_url,
        }
    }

    /// Build a report. File reads are tiny procfs reads; VRAM is best effort.
    pub async fn report(&mut self) -> Outbound {
        let cpu = tokio::fs::read_to_string("/proc/stat")
            .await
            .ok()
            .and_then(|s| parse_cpu(&s));
        let cpu_percent = match (self.last_cpu, cpu) {
            (Some(a), Some(b)) if b.total > a.total => {
                let busy = (b.total - a.total).saturating_sub(b.idle.saturating_sub(a.idle));
                (busy as f64 * 100.0 / (b.total - a.total) as f64 * 10.0).round() / 10.0
            }
            _ => 0.0,
        };
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        let (ram_used_bytes, ram_total_bytes) = tokio::fs::read_to_string("/proc/meminfo")
            .await
            .ok()
            .and_then(|s| parse_meminfo(&s))
            .unwrap_or((0, 0));
        let (vram_used_bytes, vram_total_bytes) = self.vram().await;
        Outbound::ResourceReport {
            cpu_percent,
            ram_used_bytes,
            ram_total_bytes,
            vram_used_bytes,
            vram_total_bytes,
            timestamp: crate::util::now_ms(),
        }
    }

    /// VRAM held by loaded models, from Ollama's `/api/ps` (`models[].size_vram`).
    async fn vram(&self) -> (Option<u64>, Option<u64>) {
        let (Some(http), Some(base)) = (&self.http, &self.ollama_url) else {
            return (None, None);
        };
        let url = format!("{}/api/ps", crate::util::http_base_url(base));
        let Ok(resp) = http.get(url).send().await else {
            return (None, None);
        };
        let Ok(v) = resp.json::<serde_json::Value>().await else {
            return (None, None);
        };
        let used = v["models"]
            .as_array()
            .map(|ms| ms.iter().filter_map(|m| m["size_vram"].as_u64()).sum());
        (used, None)
    }
}

fn parse_cpu(stat: &str) -> Option<CpuSample> {
    let line = stat.lines().next()?;
    let nums: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if nums.len() < 4 {
        return None;
    }
    // idle + iowait count as idle.
    let idle = nums[3] + nums.get(4).copied().unwrap_or(0);
    Some(CpuSample {
        idle,
        total: nums.iter().sum(),
    })
}

fn parse_meminfo(s: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        s.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:")?;
    let avail = field("MemAvailable:")?;
    Some((total.saturating_sub(avail), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_procfs() {
        let c = parse_cpu("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!(c.idle, 800);
        assert_eq!(c.total, 1000);
        let m = parse_meminfo("MemTotal:       1000 kB\nMemFree: 10 kB\nMemAvailable:    250 kB\n");
        assert_eq!(m, Some((750 * 1024, 1000 * 1024)));
    }

    /// `ollama_url` as `host:port` (no scheme), the form the hub's routing uses too.
    #[tokio::test]
    async fn vram_is_read_from_an_ollama_url_without_a_scheme() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = sock.read(&mut buf).await.unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let body = r#"{"models":[{"size_vram":1000},{"size_vram":24}]}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(reply.as_bytes()).await.unwrap();
            request
        });
        let s = ResourceSampler::new(Some(format!("{addr}/")));
        assert_eq!(s.vram().await, (Some(1024), None));
        let request = server.await.unwrap();
        assert!(request.starts_with("GET /api/ps "), "{request}");
    }

    #[tokio::test]
    async fn report_is_a_resource_report_with_ram() {
        let mut s = ResourceSampler::new(None);
        match s.report().await {
            Outbound::ResourceReport {
                ram_total_bytes, ..
            } => assert!(ram_total_bytes > 0),
            other => panic!("{other:?}"),
        }
    }
}
