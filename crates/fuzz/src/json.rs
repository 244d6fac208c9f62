//! Mutations of a valid JSON document: fields missing, values of the wrong type, numbers at
//! their edges.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

/// What a chosen value becomes.
#[derive(Debug, Clone)]
pub enum Change {
    /// Removed from its object or array (the root: replaced by `null`).
    Remove,
    /// Replaced by another value.
    Replace(Value),
    /// (An array) emptied, or (an object) stripped of every field.
    Empty,
    /// (An array) its first element repeated to `n` elements.
    Grow(usize),
}

/// Values put in place of others: every JSON type, numbers at the edges of the integer types
/// readers convert them to, a long string.
pub fn edge_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(""),
        json!("x"),
        json!("9"),
        Value::String("é".repeat(5000)),
        json!(0),
        json!(1),
        json!(-1),
        json!(0.5),
        json!(-1e9),
        json!(2147483648u64),
        json!(4294967296u64),
        json!(9223372036854775807u64),
        json!(9223372036854775808u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!([]),
        json!({}),
        json!([0]),
    ]
}

/// One change at a value chosen among the document's values (pre-order).
#[derive(Debug, Clone)]
pub struct Op {
    /// Which value.
    pub at: Index,
    /// What it becomes.
    pub change: Change,
}

/// A JSON step of a path: an object's key or an array's index.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Item(usize),
}

fn paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                prefix.push(Step::Key(k.clone()));
                paths(v, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                prefix.push(Step::Item(i));
                paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match (step, v) {
        (Step::Key(k), Value::Object(map)) => map.get_mut(k).expect("path from the same document"),
        (Step::Item(i), Value::Array(items)) => &mut items[*i],
        _ => unreachable!("path from the same document"),
    })
}

impl Op {
    /// Applies the op; returns the path it changed, as text.
    fn apply(&self, doc: &mut Value) -> String {
        apply_at(doc, |n| self.at.index(n), &self.change)
    }
}

/// Applies `change` to the value `pick(n)` of the document's `n` values (pre-order).
fn apply_at(doc: &mut Value, pick: impl FnOnce(usize) -> usize, change: &Change) -> String {
    {
        let mut all = Vec::new();
        paths(doc, &mut Vec::new(), &mut all);
        let path = all.swap_remove(pick(all.len()));
        let text = path
            .iter()
            .map(|s| match s {
                Step::Key(k) => format!(".{k}"),
                Step::Item(i) => format!("[{i}]"),
            })
            .collect::<String>();
        match (change, path.split_last()) {
            (Change::Remove, Some((last, parent))) => match (last, at_mut(doc, parent)) {
                (Step::Key(k), Value::Object(map)) => _ = map.remove(k),
                (Step::Item(i), Value::Array(items)) => _ = items.remove(*i),
                _ => {}
            },
            (Change::Remove, None) => *doc = Value::Null,
            (Change::Replace(v), _) => *at_mut(doc, &path) = v.clone(),
            (Change::Empty, _) => match at_mut(doc, &path) {
                Value::Array(items) => items.clear(),
                Value::Object(map) => map.clear(),
                Value::String(s) => s.clear(),
                other => *other = Value::Null,
            },
            (Change::Grow(n), _) => {
                if let Value::Array(items) = at_mut(doc, &path)
                    && let Some(first) = items.first().cloned()
                {
                    items.resize(*n, first);
                }
            }
        }
        if text.is_empty() { "(root)".to_string() } else { text }
    }
}

/// A document made from a valid one by some ops; `Debug` shows the changed paths.
#[derive(Clone)]
pub struct MutatedJson {
    /// What changed where.
    pub changes: Vec<(String, Change)>,
    /// The document as text.
    pub text: String,
}

impl std::fmt::Debug for MutatedJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (path, change) in &self.changes {
            let change = format!("{change:?}");
            write!(f, "{path} → {}; ", change.chars().take(80).collect::<String>())?;
        }
        Ok(())
    }
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => Just(Change::Remove),
        5 => proptest::sample::select(edge_values()).prop_map(Change::Replace),
        1 => Just(Change::Empty),
        1 => proptest::sample::select(vec![2usize, 100, 100_000]).prop_map(Change::Grow),
    ]
}

/// Documents made from `valid` (JSON text) by one to three changes, written back compactly.
pub fn mutations(valid: &str) -> impl Strategy<Value = MutatedJson> + use<> {
    let doc: Value = serde_json::from_str(valid).expect("a valid JSON document to mutate");
    let op = (any::<Index>(), change()).prop_map(|(at, change)| Op { at, change });
    proptest::collection::vec(op, 1..=3).prop_map(move |ops| {
        let mut doc = doc.clone();
        let changes = ops.iter().map(|op| (op.apply(&mut doc), op.change.clone())).collect();
        MutatedJson { changes, text: doc.to_string() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_reach_every_value() {
        let mut doc = json!({"a": [1, {"b": 2}], "c": "x"});
        let mut all = Vec::new();
        paths(&doc, &mut Vec::new(), &mut all);
        assert_eq!(all.len(), 6);
        assert_eq!(apply_at(&mut doc, |_| 4, &Change::Remove), ".a[1].b");
        assert_eq!(doc, json!({"a": [1, {}], "c": "x"}));
        assert_eq!(apply_at(&mut doc, |_| 1, &Change::Grow(3)), ".a");
        assert_eq!(doc, json!({"a": [1, {}, 1], "c": "x"}));
        assert_eq!(apply_at(&mut doc, |_| 5, &Change::Replace(json!(-1))), ".c");
        assert_eq!(apply_at(&mut doc, |_| 0, &Change::Remove), "(root)");
        assert_eq!(doc, Value::Null);
    }
}
