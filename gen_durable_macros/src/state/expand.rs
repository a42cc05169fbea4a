//! Writing `impl DurableState`: an object check, then one lookup per field.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};

use super::validate::{Absent, StateModel};
use crate::common::type_string;

pub(super) fn expand(model: &StateModel) -> TokenStream {
    let input = &model.input;
    let ident = &input.ident;
    let type_name = ident.to_string();
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let cast = model.fields.as_ref().map(|fields| {
        let inits = fields.iter().map(|f| {
            let (field, ty, key) = (&f.ident, &f.ty, &f.key);
            let expected = type_string(&ty.to_token_stream());
            let absent = match &f.absent {
                Absent::Default | Absent::Skipped => quote!(::core::default::Default::default()),
                Absent::DefaultWith(path) => quote!(#path()),
                Absent::None => quote!(::core::option::Option::None),
                Absent::Missing => quote! {
                    return ::core::result::Result::Err(::gen_durable::__private::CastError::missing(
                        ::std::format!("{}.{}", path, #key),
                        #expected,
                    ))
                },
            };
            if let Absent::Skipped = f.absent {
                return quote!(#field: #absent,);
            }
            quote! {
                #field: match object.get(#key) {
                    ::core::option::Option::Some(value) => {
                        (&&::gen_durable::__private::CastVia::<#ty>::new())
                            .cast_via(value, &::std::format!("{}.{}", path, #key))?
                    }
                    ::core::option::Option::None => #absent,
                },
            }
        });
        quote! {
            #[allow(unused_variables)]
            fn cast_at(
                value: &::gen_durable::__private::Value,
                path: &str,
            ) -> ::core::result::Result<Self, ::gen_durable::__private::CastError> {
                #[allow(unused_imports)]
                use ::gen_durable::__private::{CastViaSerde as _, CastViaState as _};
                let ::gen_durable::__private::Value::Object(object) = value else {
                    return ::core::result::Result::Err(::gen_durable::__private::CastError {
                        path: ::std::string::String::from(path),
                        expected: ::std::string::String::from("object"),
                        found: ::std::string::String::from(::gen_durable::__private::json_kind(value)),
                    });
                };
                ::core::result::Result::Ok(Self { #(#inits)* })
            }
        }
    });
    quote! {
        #[automatically_derived]
        impl #impl_generics ::gen_durable::__private::DurableState for #ident #ty_generics #where_clause {
            const TYPE_NAME: &'static str = #type_name;
            #cast
        }
    }
}
