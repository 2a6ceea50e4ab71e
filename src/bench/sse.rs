//! Server-sent-events framing, as the WHATWG spec reads it: bytes in (any chunking),
//! the `data` of each complete event out. Lines end in LF, CRLF or CR (sse-starlette,
//! which llama.cpp's Python server uses, writes CRLF); `:` lines are comments (keep-alive
//! pings); fields other than `data` are ignored; several `data` lines join with LF.

/// Incremental SSE decoder for one response body.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF starting the next one belongs to it.
    after_cr: bool,
    /// `data` lines of the event being read.
    data: Option<String>,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk of the body; returns the events it completed, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, false);
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.end_line(&line) {
                        events.push(event);
                    }
                }
                _ => self.line.push(b),
            }
        }
        events
    }

    /// The body ended: an event left without its blank line is still delivered (a
    /// lenient reading; a strict one drops it).
    pub fn finish(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            if let Some(event) = self.end_line(&line) {
                return Some(event);
            }
        }
        self.data.take()
    }

    fn end_line(&mut self, line: &[u8]) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line[0] == b':' {
            return None;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.find(':') {
            Some(i) => (
                &text[..i],
                text[i + 1..].strip_prefix(' ').unwrap_or(&text[i + 1..]),
            ),
            None => (&text[..], ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out: Vec<String> = chunks.iter().flat_map(|c| d.push(c)).collect();
        out.extend(d.finish());
        out
    }

    #[test]
    fn splits_events_whatever_the_chunking_and_line_endings() {
        let body =
            b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: ping - 2026\r\n\r\ndata:[DONE]\r\r";
        let want = vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"];
        assert_eq!(all(&[body]), want);
        // Byte by byte, so CR and LF of one CRLF arrive in different chunks.
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(all(&bytes), want);
        for cut in 0..body.len() {
            assert_eq!(all(&[&body[..cut], &body[cut..]]), want, "cut at {cut}");
        }
    }

    #[test]
    fn joins_data_lines_and_ignores_other_fields() {
        let body = b"event: message\nid: 7\ndata: one\ndata:two\nretry: 10\n\n\n\ndata\n\n";
        assert_eq!(all(&[body]), vec!["one\ntwo", ""]);
    }

    #[test]
    fn an_event_cut_by_the_end_of_the_body_is_still_delivered() {
        assert_eq!(
            all(&[b"data: {\"x\":1}\n\ndata: {\"last\":true}"]),
            vec!["{\"x\":1}", "{\"last\":true}"]
        );
        assert_eq!(all(&[b"data: tail\n"]), vec!["tail"]);
        assert!(all(&[b": only a comment"]).is_empty());
    }
}
