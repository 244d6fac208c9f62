//! Each row's uniform from a counter-based generator keyed by (seed, record, sample, step),
//! which a sampled step draws its next token at on the devices (`siphon_models::sample`) — so
//! a completion depends on none of the mesh, the batch, the slot or a resume — and the same
//! choice on the host, in f64, as the reference the devices' is checked against: greedy (the
//! first largest, as `torch.argmax`), or drawn after Hugging Face's warpers in their order
//! (temperature, top-k, top-p, min-p).

use siphon_models::Sampling;

/// The probability of each token after the warpers (greedy: 1 for the chosen one).
pub fn probabilities(sampling: &Sampling, logits: &[f32]) -> Vec<f64> {
    let mut p = vec![0.0; logits.len()];
    if sampling.temperature == 0.0 {
        p[argmax(logits)] = 1.0;
        return p;
    }
    let mut scores: Vec<f64> = logits.iter().map(|&l| f64::from(l) / sampling.temperature).collect();
    if sampling.top_k > 0 && sampling.top_k < scores.len() {
        let mut sorted = scores.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[sampling.top_k - 1];
        scores.iter_mut().filter(|s| **s < kth).for_each(|s| *s = f64::NEG_INFINITY);
    }
    if sampling.top_p < 1.0 {
        // Ascending; the least likely whose cumulative probability stays within 1 − top_p
        // go, the likeliest always stays.
        let probs = softmax(&scores);
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
        let mut cumulative = 0.0;
        for &i in &order[..order.len() - 1] {
            cumulative += probs[i];
            if cumulative <= 1.0 - sampling.top_p {
                scores[i] = f64::NEG_INFINITY;
            }
        }
    }
    if sampling.min_p > 0.0 {
        let probs = softmax(&scores);
        let top = probs.iter().copied().fold(0.0, f64::max);
        for (s, q) in scores.iter_mut().zip(probs) {
            if q < sampling.min_p * top {
                *s = f64::NEG_INFINITY;
            }
        }
    }
    softmax(&scores)
}

/// The next token of a row: greedy, or drawn from [`probabilities`] at the uniform `u` (a
/// step's [`uniform`] of seed, record, sample and step).
pub fn choose(logits: &[f32], sampling: &Sampling, u: f32) -> u32 {
    if sampling.temperature == 0.0 {
        return argmax(logits) as u32;
    }
    let probs = probabilities(sampling, logits);
    let u = f64::from(u);
    let mut cumulative = 0.0;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cumulative += p;
            last = i;
            if u < cumulative {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The first index of the largest logit (NaN never wins).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() && !l.is_nan() {
            best = i;
        }
    }
    best
}

fn softmax(scores: &[f64]) -> Vec<f64> {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|&s| if s == f64::NEG_INFINITY { 0.0 } else { (s - max).exp() }).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// A uniform in `[0, 1)` from `key`, a multiple of 2⁻²⁴ (an f32 exactly, as a step takes it):
/// SplitMix64's finalizer over each word in turn (a counter-based generator: the same key
/// gives the same draw on any machine).
pub fn uniform(key: [u64; 4]) -> f32 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for word in key {
        h = mix(h ^ mix(word.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    }
    (h >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_largest() {
        assert_eq!(choose(&[0.5, 2.0, 2.0, -1.0], &Sampling::default(), 0.0), 1);
    }

    #[test]
    fn the_warpers_keep_what_hugging_face_keeps() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let keep = |s: Sampling| probabilities(&s, &logits).iter().map(|&p| p > 0.0).collect::<Vec<_>>();
        let t = Sampling { temperature: 1.0, ..Sampling::default() };
        assert_eq!(keep(Sampling { top_k: 2, ..t }), [true, true, false, false, false]);
        // softmax: .636, .234, .086, .032, .012; top-p 0.8 keeps the two whose sum reaches it.
        assert_eq!(keep(Sampling { top_p: 0.8, ..t }), [true, true, false, false, false]);
        assert_eq!(keep(Sampling { top_p: 0.9, ..t }), [true, true, true, false, false]);
        // min-p 0.1 of .636: drops those under .0636.
        assert_eq!(keep(Sampling { min_p: 0.1, ..t }), [true, true, true, false, false]);
        let p = probabilities(&Sampling { temperature: 2.0, ..t }, &logits);
        let expect: Vec<f64> = {
            let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / 2.0).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        };
        assert!(p.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-12), "{p:?}");
    }

    #[test]
    fn draws_depend_on_every_word_of_the_key_and_spread_evenly() {
        let base = uniform([1, 2, 3, 4]);
        for i in 0..4 {
            let mut key = [1, 2, 3, 4];
            key[i] += 1;
            assert_ne!(uniform(key), base);
        }
        let n = 100_000;
        let mut bins = [0usize; 10];
        for step in 0..n {
            bins[(uniform([7, 0, 0, step]) * 10.0) as usize] += 1;
        }
        assert!(bins.iter().all(|&b| (b as f64 - n as f64 / 10.0).abs() < 500.0), "{bins:?}");
    }
}
