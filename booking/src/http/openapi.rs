//! The OpenAPI document, generated from the handlers' annotations. `booking openapi` prints it; the committed
//! copy (`booking/openapi.json`) is checked against it by the tests.

use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, path::Operation};
use utoipa::{Modify, OpenApi};

use super::{admin, error, events, hold_views, holds, lifecycle, live_map, ops, orders, webhooks};

#[derive(OpenApi)]
#[openapi(
    info(title = "Booking API", description = "Seat holds and checkout behind the waiting-room gateway. Every \
        error body is `{\"error\": \"<code>\", \"message\": \"...\"}` plus details."),
    paths(
        events::get_event, events::get_seats, events::get_availability, live_map::get_layout, live_map::get_status,
        holds::create_hold, holds::release_hold, holds::extend_hold,
        orders::create_order, lifecycle::get_order, lifecycle::start_payment, lifecycle::extend_order,
        webhooks::payment_webhook,
        admin::get_order, admin::cancel_order, admin::refund_order, admin::event_orders,
        ops::healthz, ops::readyz,
    ),
    components(schemas(error::ErrorBody, hold_views::Alternative)),
    modifiers(&AdmissionAuth, &Links),
)]
struct ApiDoc;

struct AdmissionAuth;

impl Modify for AdmissionAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admission",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("Admission proof issued by the gateway (or `booking token admission`)"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The operator token, `BOOKING_ADMIN_TOKEN`"))
                    .build(),
            ),
        );
    }
}

/// Links from what a fan creates to what can be done with it next: a hold to its release, extension and
/// checkout, an order to its reading, payment and extension, for clients and tools that follow links
/// (schemathesis's stateful phase reads them; in `deploy/contract-test` it does not yet start a scenario from a
/// hold).
struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let on_hold = |operation: &str| {
            LinkBuilder::new()
                .operation_id(operation)
                .parameter("event_id", "$request.path.event_id")
                .parameter("hold_token", "$response.body#/hold_token")
                .build()
        };
        let check_out = LinkBuilder::new()
            .operation_id("create_order")
            .parameter("event_id", "$request.path.event_id")
            .request_body(Some(serde_json::json!({ "hold_token": "$response.body#/hold_token" })))
            .build();
        let on_order = |operation: &str| {
            LinkBuilder::new()
                .operation_id(operation)
                .parameter("event_id", "$request.path.event_id")
                .parameter("order_id", "$response.body#/order_id")
                .build()
        };
        let paths = &mut openapi.paths.paths;
        let created = |operation: Option<&mut Operation>, links: Vec<(&str, Link)>| {
            let Some(RefOr::T(response)) = operation.and_then(|o| o.responses.responses.get_mut("201")) else {
                return;
            };
            response.links.extend(links.into_iter().map(|(name, link)| (name.to_owned(), RefOr::T(link))));
        };
        created(
            paths.get_mut("/events/{event_id}/holds").and_then(|p| p.post.as_mut()),
            vec![("release", on_hold("release_hold")), ("extend", on_hold("extend_hold")), ("check_out", check_out)],
        );
        created(
            paths.get_mut("/events/{event_id}/orders").and_then(|p| p.post.as_mut()),
            vec![
                ("read", on_order("get_order")),
                ("pay", on_order("start_payment")),
                ("extend", on_order("extend_order")),
            ],
        );
    }
}

/// The document as pretty JSON.
pub fn document() -> String {
    let json = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    // utoipa 5.5 writes a link's fields in snake case; OpenAPI spells them `operationId` and `requestBody`. No
    // other object of this document has fields by those names.
    json.replace("\"operation_id\": ", "\"operationId\": ").replace("\"request_body\": ", "\"requestBody\": ")
}
