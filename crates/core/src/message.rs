//! Error texts a client reads, bounded in bytes.
//!
//! Messages quote what the client sent (an unknown namespace, a JSON value
//! of the wrong type), which may be as long as a whole request. The
//! limiting server's surfaces and the config API cut them the same way,
//! so the bound lives here, below both.

/// The longest message an error answer carries, in bytes (a cut message
/// is a few bytes longer, for the mark of the cut). Messages quote what
/// the client sent (an unknown namespace, a JSON value of the wrong type),
/// which may be as long as a whole request; a gRPC status travels in the
/// `grpc-message` trailer, and an HTTP/2 client refuses a header list
/// past its limit (tonic's is 16 KiB) by resetting the stream or even the
/// connection, so an uncut message turned a clear error into a broken
/// call, which a client may take for an outage (issue 16).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `text` cut to about [`MAX_MESSAGE_BYTES`]: its beginning and its end
/// (where a message's explanation usually is), with the number of bytes
/// left out in between.
pub fn bounded(text: String) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text;
    }
    let floor = |mut i: usize| {
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = floor(MAX_MESSAGE_BYTES * 2 / 3);
    let tail = floor(text.len() - MAX_MESSAGE_BYTES / 3 + 32);
    format!(
        "{}…[{} bytes cut]…{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_keep_their_beginning_and_end_within_the_bound() {
        assert_eq!(bounded("short".into()), "short");
        let long = format!("unknown namespace `{}` (the end)", "é".repeat(30_000));
        let cut = bounded(long.clone());
        assert!(cut.len() <= MAX_MESSAGE_BYTES + 32, "{}", cut.len());
        assert!(cut.starts_with("unknown namespace `éé"));
        assert!(cut.ends_with("éé` (the end)"));
        let (head, rest) = cut.split_once("…[").unwrap();
        let (n, tail) = rest.split_once(" bytes cut]…").unwrap();
        assert_eq!(
            head.len() + n.parse::<usize>().unwrap() + tail.len(),
            long.len()
        );
        for n in MAX_MESSAGE_BYTES - 3..MAX_MESSAGE_BYTES + 5 {
            assert!(bounded("x".repeat(n)).len() <= MAX_MESSAGE_BYTES + 32);
        }
    }
}
