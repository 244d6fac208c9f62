//! Packing and padding: turns tokenized documents of one unit into fixed-length rows with
//! per-token document ids, positions and masks. Pure and synchronous.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::chat::Role;
use crate::error::{Error, Result};

mod isolated;

pub(crate) use isolated::LAYOUT as ISOLATED_LAYOUT;

/// Which side of a padded row the padding goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadSide {
    /// Pad tokens after the document (`doc doc pad pad`).
    Right,
    /// Pad tokens before the document (`pad pad doc doc`).
    Left,
}

/// How documents become rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode", content = "side")]
pub enum PackMode {
    /// Concatenate the documents of a unit (each `[BOS] text [EOS]`) and cut into rows;
    /// the last row of a unit is right-padded.
    Pack,
    /// One document per row, truncated to the row, padded on the given side.
    Pad(PadSide),
    /// Whole documents (each `[BOS] text`, as padded) packed into rows, a window of them at a
    /// time, best fit decreasing (so short ones fill the ends of rows; the rest padded); a
    /// document longer than a row is cut into rows of its own. Each document attends only
    /// its own tokens (the forward's `isolated`), its positions restarting at 0: every piece
    /// gets the activations it gets alone.
    Isolated,
}

/// Token ids with a special role. The models crate fills this from GGUF metadata; for a
/// tokenizer.json use [`SpecialTokens::detect`](crate::SpecialTokens::detect).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token, if the model has one.
    pub bos: Option<u32>,
    /// End-of-sequence (end-of-text) token, if any.
    pub eos: Option<u32>,
    /// Token written into pad positions (its value never matters: pad positions are masked).
    pub pad: u32,
    /// More ids excluded from activations wherever they occur (e.g. `<|im_start|>`).
    pub exclude: Vec<u32>,
}

/// Packing options.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PackConfig {
    /// Tokens per row.
    pub seq_len: usize,
    /// Pack or pad.
    pub mode: PackMode,
    /// Special token ids.
    pub special: SpecialTokens,
    /// Put BOS before each document (ignored when there is no BOS).
    pub doc_bos: bool,
    /// Put EOS after each document (ignored when there is no EOS).
    pub doc_eos: bool,
    /// Pack mode: start every row with BOS, so no row begins mid-document without the
    /// token models use as an attention sink. The inserted BOS is excluded like any BOS.
    pub row_bos: bool,
    /// Keep only the tokens of these roles (of conversations rendered through a chat
    /// template); the others are excluded. `None` keeps every role.
    pub keep_roles: Option<Vec<Role>>,
}

impl PackConfig {
    /// Defaults: pack mode with BOS before and EOS after each document and BOS at each row
    /// start; pad mode with BOS only.
    pub fn new(seq_len: usize, mode: PackMode, special: SpecialTokens) -> PackConfig {
        // Isolated documents are separated as padded ones: each as it is alone.
        let pack = mode == PackMode::Pack;
        PackConfig { seq_len, mode, special, doc_bos: true, doc_eos: pack, row_bos: pack, keep_roles: None }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.seq_len < 2 {
            return Err(Error::Config(format!("seq_len {} is too small (at least 2)", self.seq_len)));
        }
        if self.seq_len > i32::MAX as usize {
            return Err(Error::Config(format!("seq_len {} is too large", self.seq_len)));
        }
        Ok(())
    }

    fn bos(&self) -> Option<u32> {
        self.special.bos.filter(|_| self.doc_bos)
    }

    fn eos(&self) -> Option<u32> {
        self.special.eos.filter(|_| self.doc_eos)
    }

    fn row_bos(&self) -> Option<u32> {
        self.special.bos.filter(|_| self.row_bos && self.mode == PackMode::Pack)
    }

    /// A document to pack: plain text gets the separators this config puts around
    /// documents; a rendered conversation (`roles` non-empty) is taken as its template
    /// rendered it, special tokens included.
    fn doc<'a>(&self, content: &'a [u32], roles: &'a [Role]) -> Doc<'a> {
        match roles.is_empty() {
            true => Doc { content, roles, bos: self.bos(), eos: self.eos() },
            false => Doc { content, roles, bos: None, eos: None },
        }
    }

    fn excluded(&self, id: u32, role: Role) -> bool {
        Some(id) == self.special.bos
            || Some(id) == self.special.eos
            || self.special.exclude.contains(&id)
            || self.keep_roles.as_ref().is_some_and(|keep| !keep.contains(&role))
    }
}

/// A document's tokens with its separators.
struct Doc<'a> {
    content: &'a [u32],
    /// Each content token's role; empty for plain text.
    roles: &'a [Role],
    bos: Option<u32>,
    eos: Option<u32>,
}

impl Doc<'_> {
    /// Tokens, separators included.
    fn len(&self) -> usize {
        self.content.len() + usize::from(self.bos.is_some()) + usize::from(self.eos.is_some())
    }

    /// Token `i`, separators included.
    fn token(&self, i: usize) -> u32 {
        let lead = usize::from(self.bos.is_some());
        match self.bos {
            Some(b) if i == 0 => b,
            _ if i - lead < self.content.len() => self.content[i - lead],
            _ => self.eos.expect("index past content only when EOS is appended"),
        }
    }

    /// The role of token `i` (separators are template text).
    fn role(&self, i: usize) -> Role {
        let lead = usize::from(self.bos.is_some());
        i.checked_sub(lead).and_then(|j| self.roles.get(j)).copied().unwrap_or(Role::Template)
    }
}

/// A document an isolated packing window holds: its separated tokens from `offset` on and
/// their roles.
struct Held {
    record: u64,
    offset: u64,
    doc: i64,
    tokens: Vec<u32>,
    roles: Vec<Role>,
}

/// Marks a pad or inserted position in `Row::doc` and `Row::doc_pos`.
pub const NO_DOC: i64 = -1;

/// A global document id: `unit << 32 | record index within unit`. Stable for a corpus and
/// configuration, independent of the partition.
pub fn doc_id(unit: u32, record: u64) -> i64 {
    (i64::from(unit) << 32) | (record as i64 & 0xffff_ffff)
}

/// One finished row, and where the stream continues after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub index_in_unit: u32,
    pub tokens: Vec<u32>,
    pub attention: Vec<u8>,
    pub exclude: Vec<u8>,
    pub doc: Vec<i64>,
    pub doc_pos: Vec<i32>,
    /// Each token's [`Role`] (`Template` for plain documents, separators and padding).
    pub role: Vec<u8>,
    /// Next (record index, token offset) within the unit, or None if the unit is done.
    pub next: Option<(u64, u64)>,
    /// Rows already made of the isolated packing window that starts at `next` (0 when `next`
    /// is a window's start, and in the other modes): a stream resumed there packs the window
    /// again and drops them.
    pub skip: u32,
    /// Whether the row's last document goes on past it (cut off, or continued in the next).
    pub cut: bool,
}

/// Packs the documents of one unit. Feed documents in record order with [`Packer::push`],
/// then call [`Packer::finish`].
pub(crate) struct Packer {
    cfg: Arc<PackConfig>,
    unit: u32,
    next_index: u32,
    cur: Option<Row>,
    /// Isolated mode: the documents held until their window is packed.
    window: Vec<Held>,
    window_tokens: usize,
    /// Isolated mode: rows of the first window made before a resume (packed again, dropped).
    skip: u32,
    /// Counters for stats.
    pub truncated_docs: u64,
    pub pad_tokens: u64,
}

impl Packer {
    /// `first_index` is the row index within the unit of the first row produced (non-zero
    /// on resume).
    pub fn new(cfg: Arc<PackConfig>, unit: u32, first_index: u32) -> Packer {
        Packer {
            cfg,
            unit,
            next_index: first_index,
            cur: None,
            window: Vec::new(),
            window_tokens: 0,
            skip: 0,
            truncated_docs: 0,
            pad_tokens: 0,
        }
    }

    /// Resumes inside an isolated packing window: its first `skip` rows (numbered from the
    /// packer's first index) were made before and are dropped.
    pub fn skipping(mut self, skip: u32) -> Packer {
        self.skip = skip;
        self
    }

    fn empty_row(&mut self) -> Row {
        let n = self.cfg.seq_len;
        let row = Row {
            index_in_unit: self.next_index,
            tokens: Vec::with_capacity(n),
            attention: Vec::with_capacity(n),
            exclude: Vec::with_capacity(n),
            doc: Vec::with_capacity(n),
            doc_pos: Vec::with_capacity(n),
            role: Vec::with_capacity(n),
            next: None,
            skip: 0,
            cut: false,
        };
        self.next_index += 1;
        row
    }

    /// Adds document `record` (content tokens, no separators, and each one's role, or none
    /// for plain text), starting at token `offset` of its separated form (non-zero when
    /// resuming mid-document, or going on where an earlier call stopped). Finished rows are
    /// appended to `out`; once it holds `max_rows` rows with the document not done, packing stops
    /// and the offset to go on from is returned (the rows are those one call would make).
    /// Isolated mode holds the document and adds a whole window's rows once it is full.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        record: u64,
        stable: u64,
        content: &[u32],
        roles: &[Role],
        offset: u64,
        max_rows: usize,
        out: &mut Vec<Row>,
    ) -> Option<u64> {
        let cfg = self.cfg.clone();
        let cfg = &*cfg;
        let doc = doc_id(self.unit, stable);
        let document = cfg.doc(content, roles);
        let len = document.len();
        match cfg.mode {
            PackMode::Pad(side) => {
                let mut row = self.empty_row();
                let take = len.min(cfg.seq_len);
                if len > take {
                    self.truncated_docs += 1;
                    row.cut = true;
                }
                let pad = cfg.seq_len - take;
                self.pad_tokens += pad as u64;
                if side == PadSide::Left {
                    push_pad(cfg, &mut row, pad);
                }
                for i in 0..take {
                    push_tok(cfg, &mut row, document.token(i), doc, i as i32, document.role(i));
                }
                if side == PadSide::Right {
                    push_pad(cfg, &mut row, pad);
                }
                row.next = Some((record + 1, 0));
                out.push(row);
                None
            }
            PackMode::Isolated => {
                // Held (from `offset` on) until the window is full; then all its rows at once.
                let from = offset as usize;
                self.window.push(Held {
                    record,
                    offset,
                    doc,
                    tokens: (from..len).map(|i| document.token(i)).collect(),
                    roles: (from..len).map(|i| document.role(i)).collect(),
                });
                self.window_tokens += len - from;
                if self.window_tokens >= isolated::WINDOW_ROWS * cfg.seq_len {
                    self.pack_window(Some((record + 1, 0)), out);
                }
                None
            }
            PackMode::Pack => self.pack(record, doc, &document, offset, max_rows, out),
        }
    }

    /// Packs `document` from token `offset` on into the current row and new ones, as
    /// [`Packer::push`] says.
    fn pack(
        &mut self,
        record: u64,
        doc: i64,
        document: &Doc<'_>,
        offset: u64,
        max_rows: usize,
        out: &mut Vec<Row>,
    ) -> Option<u64> {
        let cfg = self.cfg.clone();
        let cfg = &*cfg;
        let len = document.len();
        let mut i = offset as usize;
        while i < len {
            let mut row = match self.cur.take() {
                Some(row) => row,
                None => {
                    let mut row = self.empty_row();
                    if let Some(b) = cfg.row_bos() {
                        // The document's own BOS serves when the row starts with it.
                        let starts_with_bos = i == 0 && document.token(0) == b;
                        if !starts_with_bos {
                            push_tok(cfg, &mut row, b, NO_DOC, -1, Role::Template);
                        }
                    }
                    row
                }
            };
            let room = cfg.seq_len - row.tokens.len();
            let take = room.min(len - i);
            for j in i..i + take {
                push_tok(cfg, &mut row, document.token(j), doc, j as i32, document.role(j));
            }
            i += take;
            if row.tokens.len() == cfg.seq_len {
                row.next = Some(if i < len { (record, i as u64) } else { (record + 1, 0) });
                row.cut = i < len;
                out.push(row);
                if out.len() >= max_rows && i < len {
                    return Some(i as u64);
                }
            } else {
                self.cur = Some(row);
            }
        }
        None
    }

    /// Ends the unit: a partial packed row is right-padded and emitted (isolated: the window
    /// packed).
    pub fn finish(&mut self, out: &mut Vec<Row>) {
        self.close(None, out);
        self.pack_window(None, out);
    }

    /// Isolated mode: packs the window's documents into rows (see [`isolated::layout`]) and
    /// empties it; `next` is where the stream goes on after its last row. A row before the
    /// last goes on at the window's start, with the rows made so far to skip.
    fn pack_window(&mut self, next: Option<(u64, u64)>, out: &mut Vec<Row>) {
        let window = std::mem::take(&mut self.window);
        self.window_tokens = 0;
        let Some(start) = window.first().map(|held| (held.record, held.offset)) else { return };
        let cfg = self.cfg.clone();
        let lens: Vec<usize> = window.iter().map(|held| held.tokens.len()).collect();
        let rows = isolated::layout(&lens, cfg.seq_len);
        let n = rows.len();
        for (k, pieces) in rows.into_iter().enumerate() {
            let mut row = self.empty_row();
            for piece in &pieces {
                let held = &window[piece.doc];
                for i in piece.start..piece.end {
                    let pos = (held.offset as usize + i) as i32;
                    push_tok(&cfg, &mut row, held.tokens[i], held.doc, pos, held.roles[i]);
                }
            }
            let last = pieces.last().expect("a row holds a piece");
            row.cut = last.end < window[last.doc].tokens.len();
            let pad = cfg.seq_len - row.tokens.len();
            push_pad(&cfg, &mut row, pad);
            (row.next, row.skip) = match k + 1 < n {
                true => (Some(start), (k + 1) as u32),
                false => (next, 0),
            };
            if k as u32 >= self.skip {
                self.pad_tokens += pad as u64;
                // A document longer than a row is counted with the row of its start.
                let long = |p: &&isolated::Piece| p.start == 0 && window[p.doc].tokens.len() > cfg.seq_len;
                self.truncated_docs += pieces.iter().filter(|p| long(p) && window[p.doc].offset == 0).count() as u64;
                out.push(row);
            }
        }
        self.skip = 0;
    }

    /// Right-pads the partial row, if there is one, and emits it with `next` as where the
    /// stream goes on after it; whether there was one.
    fn close(&mut self, next: Option<(u64, u64)>, out: &mut Vec<Row>) -> bool {
        let Some(mut row) = self.cur.take() else { return false };
        let pad = self.cfg.seq_len - row.tokens.len();
        self.pad_tokens += pad as u64;
        push_pad(&self.cfg, &mut row, pad);
        row.next = next;
        out.push(row);
        true
    }
}

fn push_tok(cfg: &PackConfig, row: &mut Row, id: u32, doc: i64, pos: i32, role: Role) {
    row.tokens.push(id);
    row.attention.push(1);
    row.exclude.push(u8::from(cfg.excluded(id, role)));
    row.doc.push(doc);
    row.doc_pos.push(pos);
    row.role.push(role as u8);
}

fn push_pad(cfg: &PackConfig, row: &mut Row, n: usize) {
    for _ in 0..n {
        row.tokens.push(cfg.special.pad);
        row.attention.push(0);
        row.exclude.push(1);
        row.doc.push(NO_DOC);
        row.doc_pos.push(-1);
        row.role.push(Role::Template as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOS: u32 = 1;
    const EOS: u32 = 2;
    const PAD: u32 = 0;

    fn special() -> SpecialTokens {
        SpecialTokens { bos: Some(BOS), eos: Some(EOS), pad: PAD, exclude: vec![99] }
    }

    #[test]
    fn pack_keeps_boundaries_and_masks() {
        let mut cfg = PackConfig::new(6, PackMode::Pack, special());
        cfg.row_bos = false;
        let mut p = Packer::new(Arc::new(cfg.clone()), 3, 0);
        let mut out = Vec::new();
        p.push(0, 0, &[10, 11, 12], &[], 0, usize::MAX, &mut out); // B 10 11 12 E  (5)
        p.push(1, 1, &[20, 99, 21], &[], 0, usize::MAX, &mut out); // B 20 99 21 E  (5)
        p.finish(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].tokens, vec![BOS, 10, 11, 12, EOS, BOS]);
        assert_eq!(out[0].exclude, vec![1, 0, 0, 0, 1, 1]);
        assert_eq!(
            out[0].doc,
            vec![doc_id(3, 0), doc_id(3, 0), doc_id(3, 0), doc_id(3, 0), doc_id(3, 0), doc_id(3, 1)]
        );
        assert_eq!(out[0].doc_pos, vec![0, 1, 2, 3, 4, 0]);
        assert_eq!(out[0].next, Some((1, 1)));
        assert_eq!(out[1].tokens, vec![20, 99, 21, EOS, PAD, PAD]);
        assert_eq!(out[1].attention, vec![1, 1, 1, 1, 0, 0]);
        assert_eq!(out[1].exclude, vec![0, 1, 0, 1, 1, 1]);
        assert_eq!(out[1].doc_pos, vec![1, 2, 3, 4, -1, -1]);
        assert_eq!(out[1].doc[4], NO_DOC);
        assert_eq!(out[1].next, None);
        assert_eq!((out[0].index_in_unit, out[1].index_in_unit), (0, 1));
        assert_eq!(p.pad_tokens, 2);
    }

    /// Isolated: whole documents as padded ones (BOS, no EOS), placed best fit decreasing
    /// within a window: the short ones fill the ends of rows, one longer than a row fills
    /// rows of its own and its rest is placed like a short one.
    #[test]
    fn isolated_documents_stay_whole_in_their_rows() {
        let cfg = Arc::new(PackConfig::new(6, PackMode::Isolated, special()));
        let mut p = Packer::new(cfg.clone(), 0, 0);
        let mut out = Vec::new();
        p.push(0, 0, &[10, 11], &[], 0, usize::MAX, &mut out); // B 10 11
        p.push(1, 1, &[20, 21], &[], 0, usize::MAX, &mut out); // B 20 21
        p.push(2, 2, &[30], &[], 0, usize::MAX, &mut out); // B 30
        p.push(3, 3, &[40, 41, 42, 43, 44, 45, 46], &[], 0, usize::MAX, &mut out); // 8: a row of its own
        assert!(out.is_empty(), "held until the window is full or the unit ends");
        p.finish(&mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].tokens, vec![BOS, 10, 11, BOS, 20, 21]);
        assert_eq!(out[0].doc_pos, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(out[1].tokens, vec![BOS, 30, 45, 46, PAD, PAD]);
        assert_eq!(out[1].doc_pos, vec![0, 1, 6, 7, -1, -1]);
        assert_eq!(out[1].attention, vec![1, 1, 1, 1, 0, 0]);
        assert_eq!(out[2].tokens, vec![BOS, 40, 41, 42, 43, 44]);
        assert_eq!((p.truncated_docs, p.pad_tokens), (1, 2));
        assert_eq!(out.iter().map(|r| r.cut).collect::<Vec<_>>(), [false, false, true]);
        assert_eq!(
            out.iter().map(|r| (r.next, r.skip)).collect::<Vec<_>>(),
            [(Some((0, 0)), 1), (Some((0, 0)), 2), (None, 0)]
        );
    }

    /// Isolated: over several windows, a packer resumed after any row (at the window's start,
    /// skipping the rows it made) makes the rows that followed it.
    #[test]
    fn isolated_resume_inside_a_window_reproduces_rows() {
        let cfg = Arc::new(PackConfig::new(6, PackMode::Isolated, special()));
        let docs: Vec<Vec<u32>> =
            (0..300u32).map(|i| (0..(i * 7) % 9 + (i % 23 == 0) as u32 * 12).map(|t| 10 + t).collect()).collect();
        let mut full = Vec::new();
        let mut p = Packer::new(cfg.clone(), 0, 0);
        for (i, d) in docs.iter().enumerate() {
            p.push(i as u64, i as u64, d, &[], 0, usize::MAX, &mut full);
        }
        p.finish(&mut full);
        let windows = full.iter().filter(|r| r.skip == 0).count();
        assert!(windows >= 3, "{windows} windows");
        for (k, row) in full.iter().enumerate().take(full.len() - 1) {
            let (rec, off) = row.next.unwrap();
            let mut rest = Vec::new();
            let mut p = Packer::new(cfg.clone(), 0, row.index_in_unit + 1 - row.skip).skipping(row.skip);
            for (i, d) in docs.iter().enumerate().skip(rec as usize) {
                p.push(i as u64, i as u64, d, &[], if i as u64 == rec { off } else { 0 }, usize::MAX, &mut rest);
            }
            p.finish(&mut rest);
            assert_eq!(rest, full[k + 1..].to_vec(), "resume after row {k}");
            // Truncated documents counted once: those whose first (whole, cut) row it made.
            let starts = rest.iter().filter(|r| r.cut && r.doc_pos[0] == 0).count() as u64;
            assert_eq!(p.truncated_docs, starts, "truncated after row {k}");
        }
    }

    #[test]
    fn row_bos_starts_every_row() {
        let cfg = PackConfig::new(4, PackMode::Pack, special());
        let mut p = Packer::new(Arc::new(cfg.clone()), 0, 0);
        let mut out = Vec::new();
        p.push(0, 0, &[10, 11, 12, 13, 14], &[], 0, usize::MAX, &mut out); // B 10 11 12 13 14 E
        p.finish(&mut out);
        // Row 0 starts with the doc's own BOS; later rows get an inserted one.
        assert_eq!(out[0].tokens, vec![BOS, 10, 11, 12]);
        assert_eq!(out[1].tokens, vec![BOS, 13, 14, EOS]);
        assert_eq!(out[1].doc[0], NO_DOC);
        assert_eq!(out[1].exclude[0], 1);
        assert_eq!(out[1].doc_pos, vec![-1, 4, 5, 6]);
        assert_eq!(out[0].next, Some((0, 4)));
    }

    #[test]
    fn pad_left_and_right_truncate() {
        for side in [PadSide::Left, PadSide::Right] {
            let cfg = PackConfig::new(5, PackMode::Pad(side), special());
            let mut p = Packer::new(Arc::new(cfg.clone()), 0, 0);
            let mut out = Vec::new();
            p.push(0, 0, &[10, 11], &[], 0, usize::MAX, &mut out);
            p.push(1, 1, &[20, 21, 22, 23, 24, 25], &[], 0, usize::MAX, &mut out);
            assert_eq!(p.truncated_docs, 1);
            let expect_short = match side {
                PadSide::Left => vec![PAD, PAD, BOS, 10, 11],
                PadSide::Right => vec![BOS, 10, 11, PAD, PAD],
            };
            assert_eq!(out[0].tokens, expect_short);
            let mask: Vec<u8> =
                expect_short.iter().enumerate().map(|(i, _)| u8::from(out[0].doc_pos[i] >= 0)).collect();
            assert_eq!(out[0].attention, mask);
            assert_eq!(
                out[0].exclude,
                expect_short.iter().map(|&t| u8::from(t == PAD || t == BOS)).collect::<Vec<_>>()
            );
            assert_eq!(out[1].tokens, vec![BOS, 20, 21, 22, 23]);
            assert_eq!((out[0].cut, out[1].cut), (false, true));
            assert_eq!(out[1].attention, vec![1; 5]);
            assert_eq!(out[1].next, Some((2, 0)));
        }
    }

    #[test]
    fn resume_mid_document_reproduces_rows() {
        let cfg = PackConfig::new(4, PackMode::Pack, special());
        let docs: Vec<Vec<u32>> = vec![vec![10, 11, 12, 13, 14, 15, 16], vec![20], vec![30, 31, 32]];
        let mut full = Vec::new();
        let mut p = Packer::new(Arc::new(cfg.clone()), 0, 0);
        for (i, d) in docs.iter().enumerate() {
            p.push(i as u64, i as u64, d, &[], 0, usize::MAX, &mut full);
        }
        p.finish(&mut full);
        for cut in 0..full.len() - 1 {
            let (rec, off) = full[cut].next.unwrap();
            let mut rest = Vec::new();
            let mut p = Packer::new(Arc::new(cfg.clone()), 0, full[cut].index_in_unit + 1);
            for (i, d) in docs.iter().enumerate().skip(rec as usize) {
                p.push(i as u64, i as u64, d, &[], if i as u64 == rec { off } else { 0 }, usize::MAX, &mut rest);
            }
            p.finish(&mut rest);
            assert_eq!(rest, full[cut + 1..].to_vec(), "resume after row {cut}");
        }
    }

    #[test]
    fn packing_a_row_at_a_time_gives_the_rows_of_one_call() {
        let cfg = Arc::new(PackConfig::new(4, PackMode::Pack, special()));
        let docs: Vec<Vec<u32>> = vec![(10..40).collect(), vec![50], (60..75).collect()];
        let mut whole = Vec::new();
        let mut p = Packer::new(cfg.clone(), 0, 0);
        for (i, d) in docs.iter().enumerate() {
            assert_eq!(p.push(i as u64, i as u64, d, &[], 0, usize::MAX, &mut whole), None);
        }
        p.finish(&mut whole);
        let mut rows = Vec::new();
        let mut p = Packer::new(cfg, 0, 0);
        for (i, d) in docs.iter().enumerate() {
            let mut offset = 0;
            loop {
                let mut out = Vec::new();
                let stopped = p.push(i as u64, i as u64, d, &[], offset, 1, &mut out);
                assert!(out.len() <= 1, "{} rows for at most one", out.len());
                rows.extend(out);
                match stopped {
                    Some(next) => offset = next,
                    None => break,
                }
            }
        }
        p.finish(&mut rows);
        assert_eq!(rows, whole);
    }
}
