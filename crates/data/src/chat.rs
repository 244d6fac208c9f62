//! Conversations rendered through a model's chat template, as transformers'
//! `apply_chat_template(messages, tokenize=True)` renders and tokenizes them, with the role
//! each token comes from.
//!
//! Templates run on minijinja with the settings transformers gives Jinja (`trim_blocks`,
//! `lstrip_blocks`, loop controls, Python's string and dict methods, `raise_exception`, a
//! `tojson` that writes what Python's `json.dumps` writes); the context holds `messages`,
//! `add_generation_prompt` (false) and the tokenizer's special tokens. `strftime_now` is not
//! defined, so templates that offer it fall back to their fixed date: the same record renders
//! the same on every host and after every resume. The rendered text is tokenized without
//! special tokens added, as transformers does.
//!
//! Roles: a token whose text overlaps a message's content takes that message's role; the rest
//! (role headers, special tokens) is template text. A template with `{% generation %}` blocks
//! marks the assistant's tokens itself (transformers' `return_assistant_tokens_mask`), and those
//! marks are used for the assistant instead of its messages' content.

use std::collections::BTreeMap;
use std::ops::{Deref, Range};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use crate::error::{Error, Result};
use crate::pieces::{Encoded, Encoder};

/// Where a token of a rendered conversation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Role {
    /// Text the template adds: role headers, separators, special tokens.
    Template = 0,
    /// A system (or developer) message.
    System = 1,
    /// A user message.
    User = 2,
    /// An assistant message.
    Assistant = 3,
    /// A tool's output.
    Tool = 4,
}

impl Role {
    /// Every role, in id order.
    pub const ALL: [Role; 5] = [Role::Template, Role::System, Role::User, Role::Assistant, Role::Tool];

    /// The role of a message's `role` field (`developer` is a system message, `ipython` and
    /// `function` are tool output, as the templates that use them treat them).
    pub fn of_message(role: &str) -> Option<Role> {
        match role {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" | "ipython" | "function" => Some(Role::Tool),
            _ => None,
        }
    }

    /// Its name (`template`, `system`, `user`, `assistant`, `tool`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Template => "template",
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role named `name`.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Markers the rewritten `{% generation %}` blocks print around the assistant's text.
const GEN_START: char = '\u{e000}';
const GEN_END: char = '\u{e001}';

/// A chat template, ready to render conversations.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Special tokens by name (`bos_token`, `eos_token`, ...), in the context of every render.
    special: BTreeMap<String, String>,
    /// The template marks the assistant's text with `{% generation %}`.
    marks_generation: bool,
    source: String,
}

/// A rendered conversation: its text and the spans of it each message's role owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The text to tokenize.
    pub text: String,
    /// Byte ranges of `text` and their roles; the rest is template text.
    pub spans: Vec<(Range<usize>, Role)>,
}

impl ChatTemplate {
    /// Compiles `source` (a transformers chat template), rendering with `special` tokens
    /// (`("bos_token", "<s>")`, ...) in its context.
    pub fn new(source: &str, special: &[(&str, &str)]) -> Result<ChatTemplate> {
        let rewritten = rewrite_generation(source);
        let marks_generation = rewritten != source;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", rewritten)
            .map_err(|e| Error::Config(format!("the chat template does not compile: {e:#}")))?;
        let special = special.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(ChatTemplate { env, special, marks_generation, source: source.to_string() })
    }

    /// The template's source, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a list of `{role, content, ...}` objects) and finds each role's
    /// spans. An error says why the conversation cannot be rendered or marked.
    pub fn render(&self, messages: &serde_json::Value) -> std::result::Result<Rendered, String> {
        self.render_with(messages, false)
    }

    /// The text of `messages` rendered with `add_generation_prompt` true: what the model
    /// completes as the assistant's next turn (transformers' `apply_chat_template(messages,
    /// add_generation_prompt=True, tokenize=False)`).
    pub fn render_prompt(&self, messages: &serde_json::Value) -> std::result::Result<String, String> {
        Ok(self.render_with(messages, true)?.text)
    }

    fn render_with(&self, messages: &serde_json::Value, prompt: bool) -> std::result::Result<Rendered, String> {
        let list = messages.as_array().ok_or("the conversation is not a list of messages")?;
        let mut roles = Vec::with_capacity(list.len());
        for (i, message) in list.iter().enumerate() {
            let role = message.get("role").and_then(|r| r.as_str()).ok_or(format!("message {i} has no \"role\""))?;
            let role = Role::of_message(role)
                .ok_or(format!("message {i} has role {role:?} (not system, user, assistant or tool)"))?;
            let content = message.get("content").ok_or(format!("message {i} has no \"content\""))?;
            if !content.is_string() && !content.is_null() {
                return Err(format!("message {i}'s content is not a string (content parts are not read)"));
            }
            roles.push(role);
        }
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut context: BTreeMap<String, Value> =
            self.special.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        context.insert("messages".into(), Value::from_serialize(messages));
        context.insert("add_generation_prompt".into(), Value::from(prompt));
        let marked = template.render(context).map_err(|e| format!("the chat template fails: {e:#}"))?;

        // The generation markers out of the text, their positions kept.
        let mut text = String::with_capacity(marked.len());
        let mut generated = Vec::new();
        let mut open = None;
        for c in marked.chars() {
            match c {
                GEN_START => open = Some(text.len()),
                GEN_END => generated.extend(open.take().map(|start| start..text.len())),
                c => text.push(c),
            }
        }
        let mut spans: Vec<(Range<usize>, Role)> = generated.into_iter().map(|r| (r, Role::Assistant)).collect();
        let mut cursor = 0;
        for (i, (message, role)) in list.iter().zip(&roles).enumerate() {
            let content = message.get("content").and_then(|c| c.as_str()).unwrap_or("");
            let wanted = content.trim();
            if wanted.is_empty() {
                continue;
            }
            let found = text[cursor..].find(content).map(|at| (at, content.len()));
            let found = found.or_else(|| text[cursor..].find(wanted).map(|at| (at, wanted.len())));
            let Some((at, len)) = found else {
                return Err(format!(
                    "the chat template changes message {i}'s content, so its tokens cannot be told from the template's"
                ));
            };
            let span = cursor + at..cursor + at + len;
            cursor = span.end;
            if !(self.marks_generation && *role == Role::Assistant) {
                spans.push((span, *role));
            }
        }
        spans.sort_by_key(|(r, _)| r.start);
        Ok(Rendered { text, spans })
    }

    /// Renders `messages` and tokenizes the text without adding special tokens: the ids and
    /// each token's role (that of the first span its text overlaps).
    pub fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        messages: &serde_json::Value,
    ) -> std::result::Result<(Vec<u32>, Vec<Role>), String> {
        match self.encode_with(&Encoder::new(tokenizer), messages, None)? {
            (Encoded { ids, cut: None, .. }, roles) => Ok((ids, roles)),
            (Encoded { cut: Some(at), .. }, _) => {
                Err(format!("the rendered conversation could not be tokenized past byte {at}"))
            }
        }
    }

    /// [`ChatTemplate::encode`] through `encoder`, which tokenizes a long conversation in
    /// bounded pieces (with `enough`, only until that many tokens): its tokens (and the byte of
    /// the rendered text where it was cut, if it was) and their roles.
    pub(crate) fn encode_with<T: Deref<Target = tokenizers::Tokenizer>>(
        &self,
        encoder: &Encoder<T>,
        messages: &serde_json::Value,
        enough: Option<usize>,
    ) -> std::result::Result<(Encoded, Vec<Role>), String> {
        let rendered = self.render(messages)?;
        let encoded = encoder.encode(rendered.text.as_str(), true, enough).map_err(|e| format!("tokenizer: {e}"))?;
        let spans = &rendered.spans;
        // Spans sorted by start that do not overlap have sorted ends too: the first span a
        // token overlaps is found by bisection (a scan per token is quadratic in a long
        // conversation).
        let disjoint = spans.windows(2).all(|w| w[0].0.end <= w[1].0.start);
        let roles = encoded
            .offsets
            .iter()
            .map(|&(start, end)| {
                let overlaps = |span: &Range<usize>| start < span.end && span.start < end.max(start + 1);
                let found = if disjoint {
                    spans.get(spans.partition_point(|(span, _)| span.end <= start)).filter(|(span, _)| overlaps(span))
                } else {
                    spans.iter().find(|(span, _)| overlaps(span))
                };
                found.map_or(Role::Template, |(_, role)| *role)
            })
            .collect();
        Ok((encoded, roles))
    }
}

/// `{% generation %}` … `{% endgeneration %}` (transformers' extension) as plain Jinja that
/// prints a marker at each end, keeping the tags' whitespace control: the markers are
/// printed inside `{% if true %}` blocks, so `trim_blocks` and `lstrip_blocks` act on them as
/// on the block tags they replace.
fn rewrite_generation(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        // The tag's end after its opening (`{%}` is not a whole tag).
        let Some(close) = rest[open + 2..].find("%}").map(|c| open + 2 + c + 2) else { break };
        let tag = &rest[open..close];
        let inner = tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let marker = match inner {
            "generation" => Some(GEN_START),
            "endgeneration" => Some(GEN_END),
            _ => None,
        };
        out.push_str(&rest[..open]);
        match marker {
            Some(marker) => {
                let left = if tag.starts_with("{%-") { "{%-" } else { "{%" };
                let right = if tag.ends_with("-%}") { "-%}" } else { "%}" };
                out.push_str(&format!("{left} if true %}}{{{{ '{marker}' }}}}{{% endif {right}"));
            }
            None => out.push_str(tag),
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, as transformers' `tojson`
/// (`indent` given by position or as `indent=`, as templates write it).
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), JinjaError> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let comma = if indent.is_some() { "," } else { ", " };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        ValueKind::String => {
            out.push_str(&serde_json::to_string(value.as_str().unwrap_or_default()).unwrap_or_default())
        }
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            // A list's items, or a map's keys each followed by its value.
            let map = value.kind() == ValueKind::Map;
            let entries: Vec<Value> = value.try_iter()?.collect();
            out.push(if map { '{' } else { '[' });
            for (i, entry) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                newline(out, depth + 1);
                let item = if map {
                    out.push_str(&serde_json::to_string(&entry.to_string()).unwrap_or_default());
                    out.push_str(": ");
                    value.get_item(entry)?
                } else {
                    entry.clone()
                };
                write_json(&item, indent, depth + 1, out)?;
            }
            if !entries.is_empty() {
                newline(out, depth);
            }
            out.push(if map { '}' } else { ']' });
        }
        _ => return Err(JinjaError::new(ErrorKind::InvalidOperation, format!("tojson cannot write {value}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + \
                          message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";

    fn chat() -> serde_json::Value {
        serde_json::json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}
        ])
    }

    #[test]
    fn content_spans_take_their_messages_roles() {
        let t = ChatTemplate::new(&format!("{CHATML}{{% if add_generation_prompt %}}x{{% endif %}}"), &[]).unwrap();
        assert!(!t.marks_generation);
        let r = t.render(&chat()).unwrap();
        assert_eq!(
            r.text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n"
        );
        let owned: Vec<(&str, Role)> = r.spans.iter().map(|(s, role)| (&r.text[s.clone()], *role)).collect();
        assert_eq!(owned, [("Be brief.", Role::System), ("Hi there", Role::User), ("Hello!", Role::Assistant)]);
    }

    #[test]
    fn generation_blocks_mark_the_assistant_and_keep_whitespace_control() {
        let source = "{% for m in messages %}{% if m.role == 'assistant' %}A: \n  {%- generation %}\n{{ m.content }}!\
                      {% endgeneration %}\n{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}";
        let t = ChatTemplate::new(source, &[]).unwrap();
        let r = t.render(&chat()).unwrap();
        assert_eq!(r.text, "system: Be brief.\nuser: Hi there\nA:Hello!!");
        let owned: Vec<(&str, Role)> = r.spans.iter().map(|(s, role)| (&r.text[s.clone()], *role)).collect();
        assert_eq!(owned, [("Be brief.", Role::System), ("Hi there", Role::User), ("Hello!!", Role::Assistant)]);
    }

    #[test]
    fn python_methods_exceptions_and_tojson_behave_as_in_transformers() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'system' %}{{ raise_exception('no system message') }}{% endif %}\
             {{ messages[0].content.strip().upper() }}|{{ messages | tojson }}|{{ bos_token }}",
            &[("bos_token", "<s>")],
        )
        .unwrap();
        let out = t.render(&serde_json::json!([{"role": "system", "content": " é <b> "}])).unwrap();
        assert_eq!(out.text, "É <B>|[{\"content\": \" é <b> \", \"role\": \"system\"}]|<s>");
        let err = t.render(&serde_json::json!([{"role": "user", "content": "x"}])).unwrap_err();
        assert!(err.contains("no system message"), "{err}");
        assert!(t.render(&serde_json::json!([{"role": "narrator", "content": "x"}])).unwrap_err().contains("narrator"));
        assert!(t.render(&serde_json::json!("text")).unwrap_err().contains("not a list"));
        // With an indent, as Python's json.dumps([...], ensure_ascii=False, indent=2) writes it.
        let t = ChatTemplate::new(
            "{{ (messages + [[]]) | tojson(2) }}|{{ [] | tojson(indent=2) }}|{{ messages | tojson(indent=2) }}",
            &[],
        )
        .unwrap();
        let out = t.render(&serde_json::json!([{"role": "system", "content": " é <b> "}])).unwrap();
        let python = "[\n  {\n    \"content\": \" é <b> \",\n    \"role\": \"system\"\n  },\n  []\n]";
        let keyword = "[\n  {\n    \"content\": \" é <b> \",\n    \"role\": \"system\"\n  }\n]";
        assert_eq!(out.text, format!("{python}|[]|{keyword}"));
    }

    #[test]
    fn a_template_that_rewrites_content_cannot_mark_roles() {
        let t = ChatTemplate::new("{% for m in messages %}{{ m.content | upper }}{% endfor %}", &[]).unwrap();
        assert!(t.render(&chat()).unwrap_err().contains("changes message 0's content"));
    }
}
