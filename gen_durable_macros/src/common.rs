//! Pieces the macros share: `key = value` attribute arguments, error collection,
//! literal checks and case conversion.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Token, Type, UnOp};

/// Collects errors so the user sees all of them at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// The collected errors as `compile_error!` invocations (empty if none).
    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        self.0
            .as_ref()
            .map(syn::Error::to_compile_error)
            .unwrap_or_default()
    }
}

/// One `key = value` of an attribute. `state = …` is parsed as a type, the rest as
/// expressions, so `version = V` parses and can be rejected with a precise message.
#[derive(Clone)]
pub(crate) struct Arg {
    pub(crate) key: Ident,
    pub(crate) value: Option<ArgValue>,
}

#[derive(Clone)]
pub(crate) enum ArgValue {
    Type(Type),
    Expr(Expr),
}

impl ArgValue {
    pub(crate) fn tokens(&self) -> TokenStream {
        match self {
            ArgValue::Type(t) => t.to_token_stream(),
            ArgValue::Expr(e) => e.to_token_stream(),
        }
    }
}

/// The keys whose value is a type.
const TYPE_KEYS: &[&str] = &["state"];

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let key: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        if !input.peek(Token![=]) {
            return Ok(Arg { key, value: None });
        }
        input.parse::<Token![=]>()?;
        let value = if TYPE_KEYS.contains(&key.to_string().as_str()) {
            ArgValue::Type(input.parse()?)
        } else {
            ArgValue::Expr(input.parse()?)
        };
        Ok(Arg {
            key,
            value: Some(value),
        })
    }
}

/// Parses `key = value, …`.
pub(crate) fn parse_args(attr: TokenStream) -> syn::Result<Vec<Arg>> {
    let parser = Punctuated::<Arg, Token![,]>::parse_terminated;
    Ok(syn::parse::Parser::parse2(parser, attr)?
        .into_iter()
        .collect())
}

/// Walks the arguments against the accepted keys: unknown, duplicate and
/// value-less keys become errors; `on` receives each well-formed one.
pub(crate) fn for_each_arg(
    macro_name: &str,
    args: Vec<Arg>,
    known: &[(&str, &str)],
    errors: &mut Errors,
    mut on: impl FnMut(&str, Arg, &mut Errors),
) {
    let mut seen: Vec<String> = Vec::new();
    for arg in args {
        let key = arg.key.to_string();
        let Some((_, example)) = known.iter().find(|(k, _)| *k == key) else {
            let list = known
                .iter()
                .map(|(k, _)| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            errors.spanned(
                &arg.key,
                format!("unknown key `{key}` in `#[{macro_name}]`; expected one of {list}"),
            );
            continue;
        };
        if seen.contains(&key) {
            errors.spanned(
                &arg.key,
                format!("`{key}` is given twice; keep one, e.g. `{example}`"),
            );
            continue;
        }
        seen.push(key.clone());
        if arg.value.is_none() {
            errors.spanned(&arg.key, format!("`{key}` needs a value, e.g. `{example}`"));
            continue;
        }
        on(&key, arg, errors);
    }
}

/// A string literal value, or an error naming the key.
pub(crate) fn string_value(key: &str, value: &ArgValue, example: &str) -> syn::Result<LitStr> {
    match value {
        ArgValue::Expr(Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        })) => {
            if s.value().is_empty() {
                Err(syn::Error::new_spanned(
                    s,
                    format!("`{key}` must not be empty, e.g. `{example}`"),
                ))
            } else {
                Ok(s.clone())
            }
        }
        other => Err(syn::Error::new_spanned(
            other.tokens(),
            format!("`{key}` must be a string literal, e.g. `{example}`"),
        )),
    }
}

/// A positive `i32` integer literal, or an error that says why not and how to fix it.
pub(crate) fn bool_value(key: &str, value: &ArgValue, example: &str) -> syn::Result<bool> {
    match value {
        ArgValue::Expr(Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        })) => Ok(b.value),
        other => Err(syn::Error::new_spanned(
            other.tokens(),
            format!("`{key}` must be `true` or `false`, e.g. `{example}`"),
        )),
    }
}

pub(crate) fn positive_int(key: &str, value: &ArgValue, example: &str) -> syn::Result<i32> {
    let hint = format!("`{key}` must be a positive integer literal, e.g. `{example}`");
    match value {
        ArgValue::Expr(Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        })) => match int.base10_parse::<i32>() {
            Ok(0) => Err(syn::Error::new_spanned(int, format!("{hint}; found 0"))),
            Ok(n) => Ok(n),
            Err(_) => Err(syn::Error::new_spanned(
                int,
                format!("{hint}; {int} does not fit in an i32"),
            )),
        },
        ArgValue::Expr(Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        })) if matches!(&**expr, Expr::Lit(ExprLit { lit: Lit::Int(_), .. })) => {
            Err(syn::Error::new_spanned(
                value.tokens(),
                format!("{hint}; found a negative number"),
            ))
        }
        other => Err(syn::Error::new_spanned(
            other.tokens(),
            format!(
                "{hint}; found `{}`, which is not an integer literal (constants and expressions are not accepted: the value is read at compile time)",
                type_string(&other.tokens())
            ),
        )),
    }
}

/// `ShipOrder` → `ship_order`, `HTTPCall` → `http_call`.
pub(crate) fn snake_case(ident: &Ident) -> String {
    let name = ident.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name);
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|j| chars[j]);
            let next = chars.get(i + 1);
            let boundary = match prev {
                None | Some('_') => false,
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                Some(p) => p.is_uppercase() && next.is_some_and(|n| n.is_lowercase()),
            };
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `send_welcome` → `SendWelcome`.
pub(crate) fn upper_camel(name: &str) -> String {
    let name = name.strip_prefix("r#").unwrap_or(name);
    name.split('_')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut cs = s.chars();
            match cs.next() {
                Some(f) => f.to_uppercase().chain(cs).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

/// Tokens printed the way a person writes them: `Vec<u8>`, not `Vec < u8 >`.
pub(crate) fn type_string(tokens: &TokenStream) -> String {
    let raw = tokens.to_string();
    let mut out = raw
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" <", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace("& ", "&")
        .replace("[ ", "[")
        .replace(" ]", "]")
        .replace(" ;", ";")
        .replace("( ", "(")
        .replace(" )", ")");
    out.retain(|c| c != '\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    #[test]
    fn snake_case_splits_words_and_acronyms() {
        let s = |n: &str| snake_case(&Ident::new(n, Span::call_site()));
        assert_eq!(s("Reserve"), "reserve");
        assert_eq!(s("ShipOrder"), "ship_order");
        assert_eq!(s("HTTPCall"), "http_call");
        assert_eq!(s("Step2Go"), "step2_go");
        assert_eq!(s("A"), "a");
    }

    #[test]
    fn upper_camel_joins_words() {
        assert_eq!(upper_camel("send_welcome"), "SendWelcome");
        assert_eq!(upper_camel("run"), "Run");
        assert_eq!(upper_camel("a__b_"), "AB");
    }

    #[test]
    fn type_string_is_compact() {
        let ty: Type = syn::parse_quote!(std::collections::HashMap<String, Vec<u8>>);
        assert_eq!(
            type_string(&ty.to_token_stream()),
            "std::collections::HashMap<String, Vec<u8>>"
        );
        let ty: Type = syn::parse_quote!(Option<&'static str>);
        assert_eq!(type_string(&ty.to_token_stream()), "Option<&'static str>");
    }
}
