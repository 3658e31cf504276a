use super::*;

fn catalogue(ids: &[i64]) -> Catalogue {
    let event = EventInfo {
        id: EventId(1),
        name: "Test".into(),
        venue: "Arena".into(),
        starts_at: "2027-01-01T20:00:00Z".into(),
        currency: "EUR".into(),
    };
    let seats = ids
        .iter()
        .map(|&id| SeatInfo {
            id: SeatId(id),
            label: format!("Block 1 Row A Seat {id}"),
            section: "Block 1".into(),
            row: "A".into(),
            number: id as i32,
            x: 0,
            y: 0,
            accessible: false,
            ticket_type_id: 1,
            price_cents: 1000,
        })
        .collect();
    Catalogue::new(event, vec![], seats, 0)
}

#[test]
fn basket_keeps_order_and_refuses_bad_shapes() {
    let cat = catalogue(&[1, 2, 3, 4]);
    assert_eq!(Basket::parse(&[3, 1], 8, &cat).map(|b| b.seats().to_vec()), Ok(vec![SeatId(3), SeatId(1)]));
    assert_eq!(Basket::parse(&[], 8, &cat), Err(BasketError::Empty));
    assert_eq!(Basket::parse(&[1, 2, 1], 8, &cat), Err(BasketError::Duplicate(SeatId(1))));
    assert_eq!(Basket::parse(&[1, 2, 3], 2, &cat), Err(BasketError::TooMany { max: 2 }));
    assert_eq!(Basket::parse(&[1, 9], 8, &cat), Err(BasketError::NotOnSale(SeatId(9))));
    assert_eq!(Basket::parse(&[-1], 8, &cat), Err(BasketError::NotOnSale(SeatId(-1))));
}

#[test]
fn seat_lists_round_trip() {
    let seats = vec![SeatId(10), SeatId(2), SeatId(300)];
    assert_eq!(join_seats(&seats), "10,2,300");
    assert_eq!(split_seats("10,2,300"), Some(seats));
    assert_eq!(split_seats("10,x"), None);
}
