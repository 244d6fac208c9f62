//! Corpus readers, parallel tokenization, packing/padding and the exact partition of a corpus over hosts.
