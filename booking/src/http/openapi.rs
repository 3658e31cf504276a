//! The OpenAPI document, generated from the handlers' annotations. `booking openapi` prints it; the committed
//! copy (`booking/openapi.json`) is checked against it by the tests.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, error, events, holds, lifecycle, ops, orders, webhooks};

#[derive(OpenApi)]
#[openapi(
    info(title = "Booking API", description = "Seat holds and checkout behind the waiting-room gateway. Every \
        error body is `{\"error\": \"<code>\", \"message\": \"...\"}` plus details."),
    paths(
        events::get_event, events::get_seats, events::get_availability,
        holds::create_hold, holds::release_hold, holds::extend_hold,
        orders::create_order, lifecycle::get_order, lifecycle::start_payment, lifecycle::extend_order,
        webhooks::payment_webhook,
        admin::get_order, admin::cancel_order, admin::refund_order, admin::event_orders,
        ops::healthz, ops::readyz,
    ),
    components(schemas(error::ErrorBody)),
    modifiers(&AdmissionAuth),
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

/// The document as pretty JSON.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}
