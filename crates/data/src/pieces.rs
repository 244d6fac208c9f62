//! Tokenizing a long text in bounded pieces, to the tokens the whole text gives.
//!
//! A tokenizer's memory grows with what it is handed at once: the `tokenizers` library keeps an
//! alignment per byte of normalized text and a string, offsets and masks per token, some 100 to
//! 200 bytes per byte of text, so a record of tens of megabytes tokenized whole takes gigabytes.
//! A text longer than [`WINDOW`] bytes is therefore tokenized window by window, and what comes
//! out is the whole text's tokens, not a concatenation of separately tokenized parts:
//!
//! - A window ends a little past where its tokens are kept: they stop at a *cut*, a token
//!   boundary of the window (a token starts there and none straddles it) at least [`CONTEXT`]
//!   bytes before the window's end, so the end of the text the tokenizer saw does not reach it.
//! - The next window starts [`CONTEXT`] bytes before that cut, so what a tokenizer does at the
//!   start of a text (a space or `▁` prepended, a regex match begun mid-word) is spent on text
//!   whose tokens are dropped; its tokens are kept from the cut on.
//! - The two windows must agree where they overlap: the same tokens (ids and offsets) over the
//!   `CONTEXT / 2` bytes before the cut, and a boundary at the cut in both.
//!
//! This is exact for any tokenizer whose token at a byte depends on less than `CONTEXT / 2`
//! bytes of text on either side of it, which is what normalizers (character-wise rewrites),
//! pre-tokenizers (BPE, WordPiece and Unigram work within the pre-token holding the byte) and
//! added tokens (matched in place) give; cutting the text where the pre-tokenizer splits it, on
//! the text alone, would not be (whether a split falls there depends on the tokenizer's regex
//! and on a prepended `▁` that some tokenizers add to every text), and tokenizing the whole
//! and dropping the rest would not be bounded. Where the dependence reaches further (a single
//! pre-token longer than the context, such as tens of kilobytes of letters without a space, or
//! a tokenizer without a pre-tokenizer over such a run), the windows disagree: the cut is tried
//! again with a longer context (up to [`MAX_CONTEXT`]) and a longer window (up to
//! [`MAX_WINDOW`]), and failing that the text is cut there: the tokens before the cut are kept,
//! the rest dropped, and the caller says so ([`Encoded::cut`]). Every choice depends on the
//! text and the tokenizer only, so a resumed run cuts the same record at the same byte.
//!
//! A text of at most [`WINDOW`] bytes is tokenized whole, as it always was.

use std::ops::Deref;
use std::sync::OnceLock;

use tokenizers::{PostProcessor, PostProcessorWrapper, Tokenizer};

/// Bytes of text tokenized at once (a longer text is tokenized in windows of this size): some
/// tens of megabytes of the tokenizer's working memory.
pub(crate) const WINDOW: usize = 256 << 10;
/// Bytes of text a window reaches past the tokens it keeps, on each side.
pub(crate) const CONTEXT: usize = 4 << 10;
/// The longest context tried when two windows disagree at a cut.
const MAX_CONTEXT: usize = 64 << 10;
/// The longest window tried when a window has no token boundary to cut at.
const MAX_WINDOW: usize = 4 * WINDOW;

/// A text's tokens.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Each token's byte range in the text as the tokenizer's `encode` gives it (post-processed:
    /// a byte-level tokenizer trims spaces from them), when asked for; else empty.
    pub offsets: Vec<(usize, usize)>,
    /// The byte at which the text was cut, when no window could be cut exactly: the tokens are
    /// those of the text before it.
    pub cut: Option<usize>,
}

/// Tokenizes texts of any length in bounded pieces with one tokenizer (see the module's
/// documentation). `T` is how the tokenizer is held (`&Tokenizer`, `Arc<Tokenizer>`).
pub(crate) struct Encoder<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    /// The tokenizer without its post-processor, whose offsets are the bytes each token covers
    /// (a byte-level post-processor trims a token's leading space from its offsets, which would
    /// hide the boundary before it). Made on the first long text.
    raw: OnceLock<Result<Tokenizer, String>>,
    window: usize,
    context: usize,
}

/// One token of a window: its id and the bytes of the text it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Token {
    id: u32,
    start: usize,
    end: usize,
}

/// A window's tokens, with the offsets `encode` would give them when asked for.
struct Window {
    tokens: Vec<Token>,
    offsets: Vec<(usize, usize)>,
}

impl<T: Deref<Target = Tokenizer>> Encoder<T> {
    /// An encoder with [`WINDOW`] and [`CONTEXT`].
    pub fn new(tokenizer: T) -> Encoder<T> {
        Encoder { tokenizer, raw: OnceLock::new(), window: WINDOW, context: CONTEXT }
    }

    /// The tokens of `text`, with their offsets when `offsets`. With `enough`, a long text is
    /// tokenized only until that many tokens are kept (more may be returned): what a job that
    /// uses no more of a record needs.
    pub fn encode(&self, text: &str, offsets: bool, enough: Option<usize>) -> Result<Encoded, String> {
        if text.len() <= self.window {
            let encoding = match offsets {
                true => self.tokenizer.encode(text, false),
                false => self.tokenizer.encode_fast(text, false),
            }
            .map_err(|e| e.to_string())?;
            let offsets = if offsets { encoding.get_offsets().to_vec() } else { Vec::new() };
            return Ok(Encoded { ids: encoding.get_ids().to_vec(), offsets, cut: None });
        }
        let mut out = Encoded::default();
        let mut from = 0;
        // The previous window's tokens over the bytes before `from` that the next must repeat.
        let mut check = Vec::new();
        loop {
            let Some((window, cut)) = self.window_from(text, from, &check, offsets)? else {
                out.cut = Some(from);
                return Ok(out);
            };
            for (token, offset) in window.tokens.iter().zip(&window.offsets).filter(|(t, _)| t.start >= from) {
                if token.start >= cut {
                    break;
                }
                out.ids.push(token.id);
                if offsets {
                    out.offsets.push(*offset);
                }
            }
            if cut == text.len() || enough.is_some_and(|n| out.ids.len() >= n) {
                return Ok(out);
            }
            check = window.before(cut, self.context / 2);
            from = cut;
        }
    }

    /// The window whose tokens from `from` on are kept, and the cut where they stop (the
    /// text's end, or a boundary [`CONTEXT`] before the window's end); `None` when no window
    /// up to the longest context and length agrees with `check` and has a boundary to cut at.
    fn window_from(
        &self,
        text: &str,
        from: usize,
        check: &[Token],
        offsets: bool,
    ) -> Result<Option<(Window, usize)>, String> {
        let mut context = self.context;
        while context <= MAX_CONTEXT.max(self.context) {
            let start = if from == 0 { 0 } else { floor_char(text, from.saturating_sub(context)) };
            let mut length = self.window;
            loop {
                let end = floor_char(text, (from + length).min(text.len()));
                let window = self.tokenize(text, start, end, offsets)?;
                if from > 0 && (window.before(from, self.context / 2) != check || !window.boundary_at(from)) {
                    break;
                }
                if end == text.len() {
                    return Ok(Some((window, end)));
                }
                if let Some(cut) = window.last_boundary(from, end.saturating_sub(self.context)) {
                    return Ok(Some((window, cut)));
                }
                if length >= MAX_WINDOW.max(self.window) {
                    return Ok(None);
                }
                length *= 2;
            }
            context *= 4;
        }
        Ok(None)
    }

    /// The tokens of `text[start..end]`, offsets counted from the text's start.
    fn tokenize(&self, text: &str, start: usize, end: usize, offsets: bool) -> Result<Window, String> {
        let raw = self.raw.get_or_init(|| without_post_processor(&self.tokenizer)).as_ref().map_err(Clone::clone)?;
        let encoding = raw.encode(&text[start..end], false).map_err(|e| e.to_string())?;
        let shift = |(s, e): &(usize, usize)| (s + start, e + start);
        let tokens: Vec<Token> = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, offset)| {
                let (start, end) = shift(offset);
                Token { id, start, end }
            })
            .collect();
        let offsets = match (offsets, self.tokenizer.get_post_processor()) {
            (false, _) => Vec::new(),
            (true, None) => encoding.get_offsets().iter().map(shift).collect(),
            (true, Some(processor)) => {
                let processed = processor.process(encoding, None, false).map_err(|e| e.to_string())?;
                processed.get_offsets().iter().map(shift).collect()
            }
        };
        let offsets = pad_offsets(offsets, &tokens);
        Ok(Window { tokens, offsets })
    }
}

/// `offsets` as long as `tokens` (empty when none were asked for), so the two zip.
fn pad_offsets(mut offsets: Vec<(usize, usize)>, tokens: &[Token]) -> Vec<(usize, usize)> {
    offsets.resize(tokens.len(), (0, 0));
    offsets
}

impl Window {
    /// The tokens starting in the `span` bytes before `at`.
    fn before(&self, at: usize, span: usize) -> Vec<Token> {
        let from = at.saturating_sub(span);
        self.tokens.iter().filter(|t| t.start >= from && t.start < at).copied().collect()
    }

    /// Whether a token starts at `at` and none before it reaches past it.
    fn boundary_at(&self, at: usize) -> bool {
        let i = self.tokens.partition_point(|t| t.start < at);
        i > 0 && self.is_boundary(i) && self.tokens[i].start == at
    }

    /// The last boundary in `(after, upto]`.
    fn last_boundary(&self, after: usize, upto: usize) -> Option<usize> {
        (1..self.tokens.len())
            .rev()
            .map(|i| (i, self.tokens[i].start))
            .skip_while(|&(_, at)| at > upto)
            .take_while(|&(_, at)| at > after)
            .find(|&(i, _)| self.is_boundary(i))
            .map(|(_, at)| at)
    }

    /// Whether the text is cut cleanly before token `i`: it and the one before cover bytes
    /// (a token of no bytes, one a normalizer added, is never cut next to) and the one before
    /// ends where it starts or earlier (tokens that split a character share its bytes).
    fn is_boundary(&self, i: usize) -> bool {
        let (before, token) = match (i.checked_sub(1).and_then(|b| self.tokens.get(b)), self.tokens.get(i)) {
            (Some(before), Some(token)) => (before, token),
            _ => return false,
        };
        before.start < before.end && token.start < token.end && before.end <= token.start
    }
}

/// The largest char boundary of `text` at or before `at`.
fn floor_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn without_post_processor(tokenizer: &Tokenizer) -> Result<Tokenizer, String> {
    let mut raw = tokenizer.clone();
    raw.with_post_processor(None::<PostProcessorWrapper>);
    raw.with_truncation(None).map_err(|e| e.to_string())?;
    raw.with_padding(None);
    Ok(raw)
}

/// `tokenizer` without the truncation and padding its file may set: the data path tokenizes
/// records whole (a record past a row is packed over rows or cut by the packer), so a
/// `truncation` left in a tokenizer.json would silently drop the end of every long record.
pub(crate) fn untruncated(tokenizer: std::sync::Arc<Tokenizer>) -> Result<std::sync::Arc<Tokenizer>, String> {
    if tokenizer.get_truncation().is_none() && tokenizer.get_padding().is_none() {
        return Ok(tokenizer);
    }
    let mut plain = (*tokenizer).clone();
    plain.with_truncation(None).map_err(|e| e.to_string())?;
    plain.with_padding(None);
    Ok(std::sync::Arc::new(plain))
}

#[cfg(test)]
impl<T: Deref<Target = Tokenizer>> Encoder<T> {
    /// An encoder with small windows, so that tests cut short texts many times.
    fn small(tokenizer: T, window: usize, context: usize) -> Encoder<T> {
        Encoder { tokenizer, raw: OnceLock::new(), window, context }
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::models::TrainerWrapper;
    use tokenizers::models::bpe::{BPE, BpeTrainer};
    use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
    use tokenizers::normalizers::{BertNormalizer, Prepend, Replace, Sequence};
    use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
    use tokenizers::{AddedToken, NormalizerWrapper};

    use super::*;

    const SPECIAL: &str = "<|sep|>";

    /// A deterministic text of `len` bytes or so: words, runs of spaces, newlines, punctuation,
    /// digits, accented, CJK and emoji characters, and the special token.
    fn text(seed: u64, len: usize) -> String {
        const PARTS: &[&str] = &[
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "Über",
            "café",
            "naïve",
            "中文字",
            "🙂",
            "don't",
            "it's",
            "12345",
            "3.14",
            "—",
            "...",
            ",",
            ".",
            "!",
            "(x)",
            "\"q\"",
            SPECIAL,
        ];
        const GAPS: &[&str] = &[" ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \n ", ""];
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = |n: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize % n
        };
        let mut out = String::new();
        while out.len() < len {
            out.push_str(PARTS[next(PARTS.len())]);
            out.push_str(GAPS[next(GAPS.len())]);
        }
        out
    }

    fn training() -> Vec<String> {
        (0..200).map(|i| text(i, 300)).collect()
    }

    fn trained(mut tokenizer: Tokenizer, trainer: impl Into<TrainerWrapper>) -> Tokenizer {
        let mut trainer = trainer.into();
        tokenizer.train(&mut trainer, training().iter()).expect("trains");
        tokenizer.add_special_tokens(&[AddedToken::from(SPECIAL, true)]);
        tokenizer
    }

    fn bpe_trainer(alphabet: bool) -> BpeTrainer {
        let mut builder = BpeTrainer::builder().vocab_size(600).show_progress(false);
        if alphabet {
            builder = builder.initial_alphabet(ByteLevel::alphabet().into_iter().collect());
        }
        builder.build()
    }

    /// GPT-2's layout: byte-level pre-tokens, BPE, offsets trimmed of spaces.
    fn byte_level() -> Tokenizer {
        let mut t = Tokenizer::new(BPE::default());
        t.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        t.with_post_processor(Some(ByteLevel::new(false, true, true)));
        trained(t, bpe_trainer(true))
    }

    /// Llama 2's: `▁` prepended to the text and spaces replaced, no pre-tokenizer (BPE over
    /// the whole text).
    fn prepended() -> Tokenizer {
        let mut t = Tokenizer::new(BPE::default());
        let steps: Vec<NormalizerWrapper> =
            vec![Prepend::new("▁".into()).into(), Replace::new(" ", "▁").expect("pattern").into()];
        t.with_normalizer(Some(Sequence::new(steps)));
        trained(t, bpe_trainer(false))
    }

    /// Metaspace pre-tokens with `▁` prepended to the first only.
    fn metaspace() -> Tokenizer {
        let mut t = Tokenizer::new(BPE::default());
        t.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
        trained(t, bpe_trainer(false))
    }

    /// BERT's: lower-cased, accents stripped, split on spaces and punctuation, WordPiece.
    fn wordpiece() -> Tokenizer {
        let mut t = Tokenizer::new(WordPiece::default());
        t.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
        t.with_pre_tokenizer(Some(BertPreTokenizer));
        let trainer = WordPieceTrainer::builder()
            .vocab_size(600)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from("[UNK]", true)])
            .build();
        trained(t, trainer)
    }

    /// Where two token lists first differ, or `None` when equal (their lists are too long to print).
    fn differ<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
        (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
    }

    fn whole(tokenizer: &Tokenizer, text: &str) -> (Vec<u32>, Vec<(usize, usize)>) {
        let encoding = tokenizer.encode(text, false).expect("encodes");
        (encoding.get_ids().to_vec(), encoding.get_offsets().to_vec())
    }

    #[test]
    fn windows_give_the_whole_texts_tokens_for_every_kind_of_tokenizer() {
        for (name, tokenizer) in [
            ("byte-level", byte_level()),
            ("prepended", prepended()),
            ("metaspace", metaspace()),
            ("wordpiece", wordpiece()),
        ] {
            for seed in 0..4 {
                let text = text(1000 + seed, 24 << 10);
                let (ids, offsets) = whole(&tokenizer, &text);
                let encoder = Encoder::small(&tokenizer, 1 << 10, 128);
                let pieces = encoder.encode(&text, true, None).expect("encodes");
                assert_eq!(pieces.cut, None, "{name}, seed {seed}: cut");
                assert_eq!(differ(&pieces.ids, &ids), None, "{name}, seed {seed}: ids");
                assert_eq!(differ(&pieces.offsets, &offsets), None, "{name}, seed {seed}: offsets");
                let alone = encoder.encode(&text, false, None).expect("encodes").ids;
                assert_eq!(differ(&alone, &ids), None, "{name}: ids alone");
            }
        }
    }

    #[test]
    fn a_long_pre_token_is_tokenized_exactly_or_cut_after_exact_tokens() {
        for (name, tokenizer) in [("byte-level", byte_level()), ("prepended", prepended())] {
            // Runs of letters and of spaces far longer than the context, among words.
            let text = format!("{} {} {}{}", text(7, 3000), "ab".repeat(3000), " ".repeat(2000), text(8, 3000));
            let (ids, _) = whole(&tokenizer, &text);
            let pieces = Encoder::small(&tokenizer, 1 << 10, 128).encode(&text, false, None).expect("encodes");
            match pieces.cut {
                None => assert_eq!(differ(&pieces.ids, &ids), None, "{name}"),
                Some(at) => {
                    let before = &ids[..pieces.ids.len().min(ids.len())];
                    assert_eq!(differ(&pieces.ids, before), None, "{name}: tokens before the cut at {at}");
                    assert!(at > 0 && at < text.len(), "{name}: cut at {at}");
                }
            }
        }
    }

    #[test]
    fn enough_tokens_stop_early_with_the_whole_texts_first_tokens() {
        let tokenizer = byte_level();
        let text = text(3, 64 << 10);
        let (ids, _) = whole(&tokenizer, &text);
        let encoder = Encoder::small(&tokenizer, 1 << 10, 128);
        let first = encoder.encode(&text, false, Some(100)).expect("encodes");
        assert!(first.ids.len() >= 100 && first.ids.len() < ids.len() / 4, "{} tokens", first.ids.len());
        assert_eq!(differ(&first.ids, &ids[..first.ids.len()]), None);
    }

    #[test]
    fn a_short_text_is_tokenized_whole() {
        let tokenizer = byte_level();
        let text = text(5, 900);
        let (ids, offsets) = whole(&tokenizer, &text);
        let encoded = Encoder::small(&tokenizer, 1 << 10, 128).encode(&text, true, None).expect("encodes");
        assert_eq!(encoded, Encoded { ids, offsets, cut: None });
    }

    #[test]
    fn truncation_and_padding_of_a_tokenizer_file_are_not_applied() {
        let mut tokenizer = byte_level();
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams { max_length: 8, ..Default::default() }))
            .expect("sets");
        let text = text(9, 2000);
        let untruncated = untruncated(std::sync::Arc::new(tokenizer)).expect("clears");
        let ids = Encoder::new(untruncated.clone()).encode(&text, false, None).expect("encodes").ids;
        assert!(ids.len() > 8, "{} tokens", ids.len());
        assert_eq!(differ(&ids, &whole(&byte_level(), &text).0), None);
    }
}
