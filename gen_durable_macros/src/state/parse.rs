//! Reading a `#[derive(DurableState)]` input: its fields and the `#[durable]` and
//! `#[serde]` attributes that decide how each field is found and defaulted.

use proc_macro2::TokenStream;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr, Token, Type};

use crate::common::Errors;

pub(super) struct StateInput {
    pub(super) input: DeriveInput,
    /// `None` for anything but a struct with named fields.
    pub(super) fields: Option<Vec<FieldInput>>,
    pub(super) serde: SerdeAttrs,
}

pub(super) struct FieldInput {
    pub(super) ident: Ident,
    pub(super) ty: Type,
    /// `#[durable(default)]`, with the attribute for spans.
    pub(super) durable_default: Option<Attribute>,
    pub(super) serde: SerdeAttrs,
}

/// The serde attributes that change how a struct is read from JSON.
#[derive(Default)]
pub(super) struct SerdeAttrs {
    pub(super) rename: Option<String>,
    pub(super) rename_all: Option<LitStr>,
    /// `default`: `Some(None)`; `default = "path"`: `Some(Some(path))`.
    pub(super) default: Option<Option<LitStr>>,
    pub(super) skip: bool,
    /// An attribute that makes serde read the type in a way we do not mirror
    /// (`flatten`, `transparent`, `from`, `try_from`, …): cast through serde then.
    pub(super) serde_only: bool,
}

pub(super) fn parse(input: DeriveInput, errors: &mut Errors) -> StateInput {
    let serde = serde_attrs(&input.attrs);
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("durable")) {
        errors.spanned(
            attr,
            "`#[durable(…)]` goes on a field, e.g. `#[durable(default)] pub paid: Option<u64>`",
        );
    }
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => Some(
                named
                    .named
                    .iter()
                    .map(|f| FieldInput {
                        ident: f.ident.clone().expect("named field"),
                        ty: f.ty.clone(),
                        durable_default: durable_default(&f.attrs, errors),
                        serde: serde_attrs(&f.attrs),
                    })
                    .collect(),
            ),
            _ => None,
        },
        _ => None,
    };
    StateInput {
        input,
        fields,
        serde,
    }
}

fn durable_default(attrs: &[Attribute], errors: &mut Errors) -> Option<Attribute> {
    let mut found = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("durable")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("default") {
                found = Some(attr.clone());
                Ok(())
            } else {
                Err(meta.error(
                    "unknown `#[durable]` option; the one option is `default`: `#[durable(default)]`",
                ))
            }
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    found
}

/// Reads the serde attributes we mirror; anything we do not understand is skipped
/// (serde reports its own errors).
fn serde_attrs(attrs: &[Attribute]) -> SerdeAttrs {
    let mut out = SerdeAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            match key.as_str() {
                "rename" | "rename_all" if meta.input.peek(Token![=]) => {
                    let s: LitStr = meta.value()?.parse()?;
                    if key == "rename" {
                        out.rename = Some(s.value());
                    } else {
                        out.rename_all = Some(s);
                    }
                }
                "rename" | "rename_all" => {
                    meta.parse_nested_meta(|inner| {
                        let s: LitStr = inner.value()?.parse()?;
                        if inner.path.is_ident("deserialize") {
                            if key == "rename" {
                                out.rename = Some(s.value());
                            } else {
                                out.rename_all = Some(s);
                            }
                        }
                        Ok(())
                    })?;
                }
                "default" => {
                    if meta.input.peek(Token![=]) {
                        out.default = Some(Some(meta.value()?.parse()?));
                    } else {
                        out.default = Some(None);
                    }
                }
                "skip" | "skip_deserializing" => out.skip = true,
                _ => {
                    if matches!(
                        key.as_str(),
                        "flatten"
                            | "transparent"
                            | "from"
                            | "try_from"
                            | "alias"
                            | "deserialize_with"
                            | "with"
                            | "untagged"
                            | "tag"
                            | "content"
                    ) {
                        out.serde_only = true;
                    }
                    skip_value(&meta)?;
                }
            }
            Ok(())
        });
    }
    out
}

fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        content.parse::<TokenStream>()?;
    }
    Ok(())
}
