//! kubectl's last-applied copy of the object: a string of escaped JSON that no rule reads, carried twice by
//! an UPDATE review (object and oldObject). serde_json stops at every escaped quote while skipping it, which
//! made it the largest part of a review (BENCHMARKS.md, "webhook cost"). This finds each copy's end 64
//! bytes at a time and gives the decoder the body with the copies emptied.
//!
//! Only well-formed copies are emptied: printable ASCII with valid escapes. Anything else is left for the
//! decoder to judge, so emptying never turns a body the decoder would refuse into one it accepts.

use std::{cell::RefCell, sync::LazyLock};

use memchr::memmem::Finder;
use wide::u8x16;

/// The key as it appears in JSON text, quotes included.
static KEY: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"kubectl.kubernetes.io/last-applied-configuration\""));

const BLOCK: usize = 64;

thread_local! {
    /// The emptied body, reused by every review on this thread instead of a body-sized allocation each.
    static EMPTIED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A body larger than this does not keep its buffer after its review.
const KEPT_CAPACITY: usize = 1 << 20;

/// Calls `read` with `body`, its last-applied values emptied when it has any.
pub fn with_copies_emptied<R>(body: &[u8], read: impl FnOnce(&[u8]) -> R) -> R {
    EMPTIED.with(|cell| {
        let Ok(mut out) = cell.try_borrow_mut() else {
            return read(body);
        };
        out.clear();
        let result = if empty_into(body, &mut out) {
            read(&out)
        } else {
            read(body)
        };
        if out.capacity() > KEPT_CAPACITY {
            *out = Vec::new();
        }
        result
    })
}

/// `body` with every last-applied value emptied (`""`), or `None` when there was none to empty.
#[cfg(test)]
fn without_last_applied(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    empty_into(body, &mut out).then_some(out)
}

/// Writes `body` into `out` with every last-applied value emptied; false (and `out` left empty) when there
/// was none to empty.
fn empty_into(body: &[u8], out: &mut Vec<u8>) -> bool {
    let (mut copied, mut from) = (0, 0);
    while let Some(at) = KEY.find(&body[from..]).map(|i| i + from) {
        from = at + KEY.needle().len();
        if escaped(body, at) {
            continue;
        }
        let Some(open) = string_value_after(body, from) else {
            continue;
        };
        let Some(len) = string_len(&body[open + 1..]) else {
            continue;
        };
        if out.is_empty() {
            out.reserve(body.len());
        }
        out.extend_from_slice(&body[copied..=open]);
        copied = open + 1 + len;
        from = copied + 1;
    }
    if copied == 0 {
        return false;
    }
    out.extend_from_slice(&body[copied..]);
    true
}

/// Whether the byte at `at` follows an odd run of backslashes (it is inside a string, escaped).
fn escaped(body: &[u8], at: usize) -> bool {
    body[..at].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// The index of the opening quote of the string value after a key that ends at `from` (`: "`).
fn string_value_after(body: &[u8], from: usize) -> Option<usize> {
    let skip_ws = |i: usize| i + body[i..].iter().take_while(|b| b.is_ascii_whitespace()).count();
    let colon = skip_ws(from);
    if body.get(colon) != Some(&b':') {
        return None;
    }
    let open = skip_ws(colon + 1);
    (body.get(open) == Some(&b'"')).then_some(open)
}

/// The length of a string's contents (`text` starts after its opening quote), when they are printable
/// ASCII with valid escapes and a closing quote follows; `None` otherwise.
fn string_len(text: &[u8]) -> Option<usize> {
    // Whether the first byte of the next block is escaped by a backslash ending this one.
    let mut carry = false;
    for (n, block) in text.chunks(BLOCK).enumerate() {
        let base = n * BLOCK;
        let masks = Masks::of(block);
        let escaped;
        (escaped, carry) = escaped_bytes(masks.backslash, carry);
        let quotes = masks.quote & !escaped;
        let end = if quotes == 0 {
            BLOCK as u32
        } else {
            quotes.trailing_zeros()
        };
        let within = low_bits(end as usize);
        if masks.unprintable & within != 0 {
            return None;
        }
        // `\"` and `\\` are valid; any other escape is read one at a time (kubectl's copy has few).
        let mut others = escaped & !(masks.quote | masks.backslash) & within;
        while others != 0 {
            escape_len(&text[base + others.trailing_zeros() as usize..])?;
            others &= others - 1;
        }
        if quotes != 0 {
            return Some(base + end as usize);
        }
    }
    None
}

/// The bytes escaped by a backslash, given a block's backslashes and whether its first byte is escaped
/// by the block before; and whether the next block's first byte is. A run of backslashes escapes every
/// second byte from its start, so runs are told apart by the parity of where they start (simdjson's way).
fn escaped_bytes(backslashes: u64, first_escaped: bool) -> (u64, bool) {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    let carried = u64::from(first_escaped);
    let backslashes = backslashes & !carried;
    let follows_backslash = (backslashes << 1) | carried;
    let odd_starts = backslashes & !EVEN & !follows_backslash;
    // Adding a run's start to the run carries past its end: odd-start runs vanish, even-start ones stay.
    let (even_runs, overflow) = odd_starts.overflowing_add(backslashes);
    let escaped = (EVEN ^ (even_runs << 1)) & follows_backslash;
    (escaped, overflow)
}

/// Bits below `i` (all of them at 64).
fn low_bits(i: usize) -> u64 {
    if i >= 64 { u64::MAX } else { (1 << i) - 1 }
}

/// The length of a valid escape after its backslash (`\n`: 1, `\u00e9`: 5), `None` if invalid.
fn escape_len(after: &[u8]) -> Option<usize> {
    match after.first()? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(1),
        b'u' if after.get(1..5)?.iter().all(u8::is_ascii_hexdigit) => Some(5),
        _ => None,
    }
}

/// One bit per byte of a block of up to 64 (bit i is byte i); a short block counts as padded with spaces.
struct Masks {
    quote: u64,
    backslash: u64,
    /// Control characters and non-ASCII bytes: left to the decoder.
    unprintable: u64,
}

impl Masks {
    fn of(block: &[u8]) -> Self {
        match <&[u8; BLOCK]>::try_from(block) {
            Ok(full) => Self::of_full(full),
            Err(_) => {
                let mut padded = [b' '; BLOCK];
                padded[..block.len()].copy_from_slice(block);
                Self::of_full(&padded)
            }
        }
    }

    /// 16 bytes at a time with SSE2 (safe wrappers from `wide`).
    fn of_full(block: &[u8; BLOCK]) -> Self {
        let mut masks = Masks {
            quote: 0,
            backslash: 0,
            unprintable: 0,
        };
        for (k, lane) in block.chunks_exact(16).enumerate() {
            let Ok(bytes) = <[u8; 16]>::try_from(lane) else {
                continue;
            };
            let v = u8x16::new(bytes);
            let bits = |m: u8x16| u64::from(m.to_bitmask()) << (16 * k);
            masks.quote |= bits(v.simd_eq(u8x16::splat(b'"')));
            masks.backslash |= bits(v.simd_eq(u8x16::splat(b'\\')));
            // The top bit is set in non-ASCII bytes already.
            masks.unprintable |= bits(v | v.simd_lt(u8x16::splat(0x20)));
        }
        masks
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    const KEY_TEXT: &str = "kubectl.kubernetes.io/last-applied-configuration";

    /// serde_json's own reading: the length of the string's contents, if it is a valid string.
    fn decoder_len(text: &[u8]) -> Option<usize> {
        let mut quoted = vec![b'"'];
        quoted.extend_from_slice(text);
        let mut values = serde_json::Deserializer::from_slice(&quoted).into_iter::<serde::de::IgnoredAny>();
        values.next()?.ok()?;
        Some(values.byte_offset() - 2)
    }

    #[test]
    fn empties_each_copy_and_keeps_the_rest() {
        let applied = json!({"metadata": {"annotations": {KEY_TEXT: "{\"inner\\\"\": 1}"}}, "x": "a\\\"b"});
        let object = json!({"metadata": {"annotations": {KEY_TEXT: applied.to_string(), "other": "kept"}}, "spec": {"n": 1}});
        let body = json!({"object": object, "oldObject": object}).to_string();
        let out = without_last_applied(body.as_bytes()).expect("two copies to empty");
        let emptied: Value = serde_json::from_slice(&out).unwrap();
        let mut expected: Value = serde_json::from_str(&body).unwrap();
        for side in ["object", "oldObject"] {
            expected[side]["metadata"]["annotations"][KEY_TEXT] = json!("");
        }
        assert_eq!(emptied, expected);
    }

    #[test]
    fn leaves_bodies_without_a_well_formed_copy_alone() {
        for body in [
            json!({"a": 1}).to_string(),
            // The key's text inside another string, escaped.
            json!({"a": format!("\"{KEY_TEXT}\": \"x\"")}).to_string(),
            // A value that is not a string.
            json!({KEY_TEXT: {"a": 1}}).to_string(),
            // Non-ASCII: left to the decoder.
            json!({KEY_TEXT: "é"}).to_string(),
            // A control character, an invalid escape, an unterminated string.
            format!("{{\"{KEY_TEXT}\": \"a\tb\"}}"),
            format!("{{\"{KEY_TEXT}\": \"a\\qb\"}}"),
            format!("{{\"{KEY_TEXT}\": \"abc"),
        ] {
            assert_eq!(without_last_applied(body.as_bytes()), None, "{body}");
        }
    }

    #[test]
    fn escapes_across_block_boundaries() {
        for at in 58..70 {
            for escape in ["\\\"", "\\\\", "\\u00e9", "\\n"] {
                let text = format!("{}{escape}tail\" rest", "a".repeat(at));
                assert_eq!(
                    string_len(text.as_bytes()),
                    decoder_len(text.as_bytes()),
                    "{text}"
                );
            }
        }
    }

    /// One byte at a time: what [`escaped_bytes`] must compute.
    fn escaped_naive(block: &[u8], first_escaped: bool) -> (u64, bool) {
        let (mut mask, mut next_escaped) = (0u64, first_escaped);
        for (i, &b) in block.iter().enumerate() {
            if next_escaped {
                mask |= 1 << i;
                next_escaped = false;
            } else {
                next_escaped = b == b'\\';
            }
        }
        (mask, next_escaped)
    }

    proptest! {
        #[test]
        fn escaped_bytes_are_every_second_of_a_run(
            block in proptest::collection::vec(prop_oneof![Just(b'\\'), Just(b'a')], 64),
            first_escaped in any::<bool>(),
        ) {
            let backslashes = Masks::of(&block).backslash;
            prop_assert_eq!(escaped_bytes(backslashes, first_escaped), escaped_naive(&block, first_escaped));
        }


        /// Wherever it answers, it agrees with serde_json about where the string ends.
        #[test]
        fn agrees_with_the_decoder(text in proptest::collection::vec(
            prop_oneof![Just(b'"'), Just(b'\\'), Just(b'u'), Just(b'a'), Just(b'0'), Just(b'\n'), any::<u8>()],
            0..300,
        )) {
            if let Some(len) = string_len(&text) {
                prop_assert_eq!(Some(len), decoder_len(&text));
            }
        }

        /// The vector masks are the bytes, one bit each.
        #[test]
        fn masks_are_the_bytes(block in proptest::collection::vec(any::<u8>(), 0..=64)) {
            let masks = Masks::of(&block);
            let naive = |hit: fn(u8) -> bool| {
                block.iter().enumerate().fold(0u64, |m, (i, &b)| m | (u64::from(hit(b)) << i))
            };
            prop_assert_eq!(masks.quote, naive(|b| b == b'"'));
            prop_assert_eq!(masks.backslash, naive(|b| b == b'\\'));
            prop_assert_eq!(masks.unprintable, naive(|b| !(0x20..0x80).contains(&b)));
        }

        /// Every string serde_json writes from printable ASCII is read to its end.
        #[test]
        fn finds_the_end_of_every_printable_string(s in "[ -~]{0,300}") {
            let quoted = serde_json::to_string(&s).unwrap();
            let text = format!("{} trailing \"", &quoted[1..]);
            prop_assert_eq!(string_len(text.as_bytes()), Some(quoted.len() - 2));
        }
    }
}
