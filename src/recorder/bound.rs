//! The per-task bound (`recorder.max_task_bytes`) as every line of a record meets it.
//!
//! Every line counts. Streamed output, events and the like ("bulk") are left out once the
//! bound is reached; the lines that tell the story (an attempt's start and end, the
//! verification, the decisions, the network summary, the end of the output, the terminal
//! frame) are still written past it, but shrunk first, strings and lists cut step by step
//! until the line is at most [`SHRUNK_LINE`] bytes (or as small as it gets). Their number is fixed
//! by the task's attempts, not by what the task prints or asks for, so one record stays
//! near its bound and retention never has to remove other tasks' records to make room for
//! it.
//!
//! The network summary (one entry per `host:port` the proxy saw, at most the proxy's
//! bound) is trimmed to the room left: the first hosts are kept and the rest counted in
//! one `(other targets)` entry per verdict.

use serde_json::{json, Value};

/// A line written past the bound is shrunk until it is at most this long, or as small as
/// the last step makes it: a step is (most bytes of a string, most items of a list). The
/// first keeps the end of an attempt's output, one stream chunk, whole.
pub(super) const SHRUNK_LINE: usize = 12 * 1024;
const SHRINK_STEPS: [(usize, usize); 3] = [(8 * 1024, 32), (1024, 8), (128, 4)];
/// Room the network summary always gets, even past the bound.
const NETWORK_MIN_ROOM: u64 = 4 * 1024;

/// Shrink `v` for a line written past the bound (see the module docs): its encoding.
pub(super) fn shrink(v: &mut Value, encode: impl Fn(&Value) -> Vec<u8>) -> Vec<u8> {
    let mut line = Vec::new();
    for (string, list) in SHRINK_STEPS {
        cut(v, string, list);
        line = encode(v);
        if line.len() <= SHRUNK_LINE {
            break;
        }
    }
    line
}

fn cut(v: &mut Value, string: usize, list: usize) {
    match v {
        Value::String(s) if s.len() > string => *s = crate::process::head_tail(s, string),
        Value::Array(a) => {
            if a.len() > list {
                let left = a.len() - list;
                a.truncate(list);
                a.push(json!(format!(
                    "… {left} more left out (recorder.max_task_bytes)"
                )));
            }
            a.iter_mut().for_each(|x| cut(x, string, list));
        }
        Value::Object(m) => m.values_mut().for_each(|x| cut(x, string, list)),
        _ => {}
    }
}

/// The hosts of a network summary that fit in `room` bytes (at least
/// [`NETWORK_MIN_ROOM`]), in order, with what did not fit summed up in one
/// `(other targets)` entry per verdict.
pub(super) fn fit_hosts(hosts: Vec<Value>, room: u64) -> Vec<Value> {
    let room = room.max(NETWORK_MIN_ROOM);
    // Room for the summary entries themselves.
    let mut used = 512u64;
    let mut kept = Vec::new();
    let mut rest: [Option<Value>; 2] = [None, None];
    for h in hosts {
        let size = h.to_string().len() as u64 + 1;
        if rest.iter().all(Option::is_none) && used + size <= room {
            used += size;
            kept.push(h);
            continue;
        }
        let allowed = h["allowed"].as_bool() == Some(true);
        let sum = rest[usize::from(allowed)].get_or_insert_with(|| {
            json!({"target": crate::sandbox::proxy::OTHER_TARGETS, "allowed": allowed,
                   "connections": 0, "bytes_up": 0, "bytes_down": 0})
        });
        for k in ["connections", "bytes_up", "bytes_down"] {
            let n = sum[k].as_u64().unwrap_or(0) + h[k].as_u64().unwrap_or(0);
            sum[k] = json!(n);
        }
    }
    kept.extend(rest.into_iter().flatten());
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_summary_is_trimmed_to_its_room_and_the_rest_summed() {
        let hosts: Vec<Value> = (0..1000)
            .map(|i| json!({"target": format!("{}-{i}.test:443", "h".repeat(200)), "allowed": false, "connections": 2, "bytes_up": 0, "bytes_down": 0}))
            .collect();
        let kept = fit_hosts(hosts, 16 * 1024);
        assert!(serde_json::to_string(&kept).unwrap().len() <= 16 * 1024);
        let last = kept.last().unwrap();
        assert_eq!(last["target"], crate::sandbox::proxy::OTHER_TARGETS);
        let listed = kept.len() as u64 - 1;
        assert_eq!(last["connections"], json!((1000 - listed) * 2));
    }

    #[test]
    fn a_shrunk_line_keeps_short_strings_and_few_items() {
        let mut v = json!({"a": "x".repeat(100_000), "l": (0..1000).map(|_| "y".repeat(5000)).collect::<Vec<_>>()});
        let line = shrink(&mut v, |v| v.to_string().into_bytes());
        assert!(line.len() <= SHRUNK_LINE, "{}", line.len());
    }
}
