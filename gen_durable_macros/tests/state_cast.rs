//! `#[derive(DurableState)]`: casts that succeed, and errors that name the field path.

use gen_durable::prelude::*;
use gen_durable::CastError;

#[derive(DurableState, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
struct Address {
    city: String,
    #[durable(default)]
    zip: String,
}

#[derive(DurableState, Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    order: u64,
    #[durable(default)]
    paid: Option<u64>,
    note: Option<String>,
    #[durable(default)]
    tags: Vec<String>,
    ship_to: Address,
    #[serde(rename = "customerId")]
    customer: String,
    items: Vec<Item>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Item {
    sku: String,
    qty: u32,
}

#[derive(DurableState, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Camel {
    order_id: u64,
    #[serde(default)]
    retry_count: u32,
}

#[derive(DurableState, Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Mode {
    Fast,
    Slow { limit: u32 },
}

fn full() -> serde_json::Value {
    json!({
        "order": 42,
        "ship_to": { "city": "Lyon" },
        "customerId": "c-1",
        "items": [{ "sku": "a", "qty": 1 }],
        "unknown": { "ignored": true }
    })
}

fn err(value: serde_json::Value) -> String {
    Order::cast(&value).unwrap_err().to_string()
}

#[test]
fn casts_with_defaults_options_nesting_and_renames() {
    let order = Order::cast(&full()).unwrap();
    assert_eq!(
        order,
        Order {
            order: 42,
            paid: None,
            note: None,
            tags: vec![],
            ship_to: Address {
                city: "Lyon".into(),
                zip: String::new()
            },
            customer: "c-1".into(),
            items: vec![Item {
                sku: "a".into(),
                qty: 1
            }],
        }
    );
    let mut v = full();
    v["paid"] = json!(100);
    v["note"] = json!(null);
    v["tags"] = json!(["gift"]);
    let order = Order::cast(&v).unwrap();
    assert_eq!(
        (order.paid, order.note, order.tags),
        (Some(100), None, vec!["gift".to_string()])
    );

    let camel = Camel::cast(&json!({ "orderId": 7 })).unwrap();
    assert_eq!(
        camel,
        Camel {
            order_id: 7,
            retry_count: 0
        }
    );
    assert_eq!(
        Mode::cast(&json!({ "Slow": { "limit": 3 } })).unwrap(),
        Mode::Slow { limit: 3 }
    );
    assert_eq!(Mode::cast(&json!("Fast")).unwrap(), Mode::Fast);
}

#[test]
fn wrong_type_names_the_path() {
    let mut v = full();
    v["order"] = json!("42");
    assert_eq!(err(v), "state.order: expected u64, found string");
}

#[test]
fn missing_field_names_the_path_and_type() {
    let mut v = full();
    v.as_object_mut().unwrap().remove("order");
    assert_eq!(
        Order::cast(&v).unwrap_err(),
        CastError {
            path: "state.order".into(),
            expected: "u64".into(),
            found: "missing".into()
        }
    );
    let mut v = full();
    v.as_object_mut().unwrap().remove("customerId");
    assert_eq!(err(v), "state.customerId: expected String, found missing");
}

#[test]
fn nested_errors_carry_the_full_path() {
    let mut v = full();
    v["ship_to"] = json!({ "zip": "69000" });
    assert_eq!(err(v), "state.ship_to.city: expected String, found missing");
    let mut v = full();
    v["ship_to"] = json!({ "city": 3 });
    assert_eq!(
        err(v),
        "state.ship_to.city: expected a string, found number"
    );
    let mut v = full();
    v["items"] = json!([{ "sku": "a", "qty": 1 }, { "sku": "b", "qty": "two" }]);
    assert_eq!(err(v), "state.items[1].qty: expected u32, found string");
    let mut v = full();
    v["paid"] = json!(true);
    assert_eq!(err(v), "state.paid: expected u64, found boolean");
}

#[test]
fn not_an_object() {
    assert_eq!(err(json!([1, 2])), "state: expected object, found array");
    assert_eq!(err(json!(null)), "state: expected object, found null");
    let mut v = full();
    v["ship_to"] = json!("Lyon");
    assert_eq!(err(v), "state.ship_to: expected object, found string");
}

#[test]
fn type_name_is_the_bare_ident() {
    assert_eq!(Order::TYPE_NAME, "Order");
    assert_eq!(Mode::TYPE_NAME, "Mode");
}
