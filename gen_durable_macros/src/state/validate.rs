//! Deciding, per field, the JSON key and what an absent key turns into.

use syn::{Ident, Type};

use super::parse::StateInput;
use crate::common::Errors;

pub(super) struct StateModel {
    pub(super) input: syn::DeriveInput,
    /// `None`: cast the whole value through serde (enums, tuple structs, and structs
    /// using serde attributes we do not mirror).
    pub(super) fields: Option<Vec<FieldModel>>,
}

pub(super) struct FieldModel {
    pub(super) ident: Ident,
    pub(super) ty: Type,
    pub(super) key: String,
    pub(super) absent: Absent,
}

pub(super) enum Absent {
    /// `Default::default()`.
    Default,
    /// `path()`, from `#[serde(default = "path")]`.
    DefaultWith(syn::ExprPath),
    /// `None`, for an `Option<_>` field.
    None,
    /// An error: "expected <type>, found missing".
    Missing,
    /// `#[serde(skip)]`: never read, always `Default::default()`.
    Skipped,
}

const RENAME_ALL: &[&str] = &[
    "lowercase",
    "UPPERCASE",
    "PascalCase",
    "camelCase",
    "snake_case",
    "SCREAMING_SNAKE_CASE",
    "kebab-case",
    "SCREAMING-KEBAB-CASE",
];

pub(super) fn validate(parsed: StateInput, errors: &mut Errors) -> StateModel {
    let StateInput {
        input,
        fields,
        serde,
    } = parsed;
    let Some(fields) = fields else {
        return StateModel {
            input,
            fields: None,
        };
    };
    // A container `#[serde(default)]` fills absent fields from the *struct's*
    // `Default`; serde does that right, so let serde cast such a struct.
    let serde_only =
        serde.serde_only || serde.default.is_some() || fields.iter().any(|f| f.serde.serde_only);
    if serde_only {
        for f in &fields {
            if let Some(attr) = &f.durable_default {
                errors.spanned(
                    attr,
                    "this struct uses serde attributes (`flatten`, `default`, `with`, …) that make serde cast it as a whole; write `#[serde(default)]` instead of `#[durable(default)]`",
                );
            }
        }
        return StateModel {
            input,
            fields: None,
        };
    }
    let rename_all = serde.rename_all.as_ref().and_then(|lit| {
        let rule = lit.value();
        if RENAME_ALL.contains(&rule.as_str()) {
            Some(rule)
        } else {
            errors.spanned(
                lit,
                format!(
                    "unknown `rename_all` rule \"{rule}\"; expected one of {}",
                    RENAME_ALL.join(", ")
                ),
            );
            None
        }
    });
    let fields = fields
        .into_iter()
        .map(|f| {
            let name = f.ident.to_string();
            let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
            let key = match (&f.serde.rename, &rename_all) {
                (Some(key), _) => key.clone(),
                (None, Some(rule)) => apply_rule(rule, &name),
                (None, None) => name,
            };
            let absent = if f.serde.skip {
                Absent::Skipped
            } else if f.durable_default.is_some() {
                Absent::Default
            } else if let Some(default) = &f.serde.default {
                match default {
                    None => Absent::Default,
                    Some(lit) => match lit.parse::<syn::ExprPath>() {
                        Ok(path) => Absent::DefaultWith(path),
                        Err(e) => {
                            errors.push(e);
                            Absent::Default
                        }
                    },
                }
            } else if is_option(&f.ty) {
                Absent::None
            } else {
                Absent::Missing
            };
            FieldModel {
                ident: f.ident,
                ty: f.ty,
                key,
                absent,
            }
        })
        .collect();
    StateModel {
        input,
        fields: Some(fields),
    }
}

/// `Option<_>`, `std::option::Option<_>`, `core::option::Option<_>`.
fn is_option(ty: &Type) -> bool {
    let Type::Path(p) = ty else { return false };
    p.qself.is_none()
        && p.path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Option" && !s.arguments.is_empty())
}

/// serde's `rename_all` on a snake_case field name.
fn apply_rule(rule: &str, field: &str) -> String {
    let words: Vec<&str> = field.split('_').filter(|w| !w.is_empty()).collect();
    let cap = |w: &str| {
        let mut cs = w.chars();
        cs.next()
            .map(|c| c.to_uppercase().chain(cs).collect::<String>())
            .unwrap_or_default()
    };
    match rule {
        "lowercase" => field.to_lowercase(),
        "UPPERCASE" => field.to_uppercase(),
        "PascalCase" => words.iter().map(|w| cap(w)).collect(),
        "camelCase" => words
            .iter()
            .enumerate()
            .map(|(i, w)| if i == 0 { w.to_string() } else { cap(w) })
            .collect(),
        "SCREAMING_SNAKE_CASE" => field.to_uppercase(),
        "kebab-case" => field.replace('_', "-"),
        "SCREAMING-KEBAB-CASE" => field.replace('_', "-").to_uppercase(),
        _ => field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::apply_rule;

    #[test]
    fn rename_all_rules_match_serde() {
        assert_eq!(apply_rule("camelCase", "order_id"), "orderId");
        assert_eq!(apply_rule("PascalCase", "order_id"), "OrderId");
        assert_eq!(apply_rule("kebab-case", "order_id"), "order-id");
        assert_eq!(apply_rule("SCREAMING_SNAKE_CASE", "order_id"), "ORDER_ID");
        assert_eq!(apply_rule("SCREAMING-KEBAB-CASE", "order_id"), "ORDER-ID");
    }
}
