//! GBNF (llama.cpp's grammar format, the EBNF that vLLM's `guided_grammar` and
//! TensorRT-LLM's `ebnf_grammar` take: `root ::= ...`) rewritten as the Lark dialect
//! llguidance reads: rules become `name: ...` on one line each, `root` becomes `start`,
//! character classes and `.` become regex terminals.

/// The Lark form of a GBNF grammar, or what is wrong with it.
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let tokens = lex(gbnf)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match (&tokens[i], tokens.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Defines)) => {
                rules.push((rule_name(n), Vec::new()));
                i += 2;
            }
            (t, _) => {
                let Some((_, body)) = rules.last_mut() else {
                    return Err(format!(
                        "the grammar must begin with a rule ('name ::= ...'), found {}",
                        t.describe()
                    ));
                };
                body.push(match t {
                    Tok::Name(n) => rule_name(n),
                    Tok::Text(s) => s.clone(),
                    Tok::Defines => return Err("'::=' must follow a rule name".into()),
                });
                i += 1;
            }
        }
    }
    if !rules.iter().any(|(n, _)| n == "start") {
        return Err("the grammar has no 'root' rule".into());
    }
    if let Some((n, _)) = rules.iter().find(|(_, b)| b.is_empty()) {
        return Err(format!("rule '{n}' is empty"));
    }
    Ok(rules
        .iter()
        .map(|(n, body)| format!("{n}: {}\n", body.join(" ")))
        .collect())
}

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// Anything copied as written (strings, regexes, operators).
    Text(String),
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Name(n) => format!("'{n}'"),
            Tok::Defines => "'::='".into(),
            Tok::Text(t) => format!("'{t}'"),
        }
    }
}

/// `root` is Lark's `start`; other names are lowercased with dashes as underscores,
/// prefixed so that none can clash with `start` or a Lark keyword.
fn rule_name(n: &str) -> String {
    if n == "root" {
        return "start".into();
    }
    let clean: String = n
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    format!("r_{clean}")
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                out.push(Tok::Defines);
                i += 3;
            }
            '"' => {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                if i >= chars.len() {
                    return Err("a string literal is not closed".into());
                }
                i += 1;
                out.push(Tok::Text(chars[start..i].iter().collect()));
            }
            '[' => {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != ']' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                if i >= chars.len() {
                    return Err("a character class is not closed".into());
                }
                i += 1;
                let class: String = chars[start..i].iter().collect();
                out.push(Tok::Text(format!("/{}/", class.replace('/', "\\/"))));
            }
            '.' => {
                out.push(Tok::Text("/[\\s\\S]/".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(Tok::Text(c.to_string()));
                i += 1;
            }
            '{' => {
                let start = i;
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                if i >= chars.len() {
                    return Err("a repetition '{m,n}' is not closed".into());
                }
                i += 1;
                let rep: String = chars[start..i]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let inner = &rep[1..rep.len() - 1];
                if inner.is_empty() || !inner.chars().all(|c| c.is_ascii_digit() || c == ',') {
                    return Err(format!("'{rep}' is not a repetition"));
                }
                out.push(Tok::Text(rep));
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '-')
                {
                    i += 1;
                }
                out.push(Tok::Name(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected '{other}' in the grammar")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_classes_and_repetitions_are_rewritten() {
        let g = r#"
            # a comment
            root ::= greeting (" " name){1,2}
            greeting ::= "hi" | "hello"
            name-part ::= [A-Z] [a-z/]*
            name ::= name-part .
        "#;
        assert_eq!(
            to_lark(g).unwrap(),
            "start: r_greeting ( \" \" r_name ) {1,2}\n\
             r_greeting: \"hi\" | \"hello\"\n\
             r_name_part: /[A-Z]/ /[a-z\\/]/ *\n\
             r_name: r_name_part /[\\s\\S]/\n"
        );
    }

    #[test]
    fn broken_grammars_are_named() {
        assert!(to_lark("a ::= \"x\"").unwrap_err().contains("root"));
        assert!(to_lark("root ::= \"x").unwrap_err().contains("not closed"));
        assert!(to_lark("\"x\" root ::= a").unwrap_err().contains("begin"));
        assert!(to_lark("root ::= [a-z").unwrap_err().contains("not closed"));
        assert!(to_lark("root ::= a{x}").unwrap_err().contains("repetition"));
        assert!(to_lark("root ::= a ; b").unwrap_err().contains("';'"));
        assert!(to_lark("root ::= ::= \"x\"")
            .unwrap_err()
            .contains("rule name"));
    }
}
