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

#[test]
fn hold_tokens_are_time_ordered_with_74_random_bits_and_order_ids_ascend() {
    // The 74 bits under the millisecond, the version and the variant: random in a token, so two tokens made in
    // the same millisecond share nothing there beyond chance (no counter to step from one to the next).
    let payload = |u: &Uuid| u.as_u128() & ((1u128 << 62) - 1) | ((u.as_u128() >> 64) & 0xfff) << 62;
    let millis = |u: &Uuid| u.as_u128() >> 80;
    let tokens: Vec<Uuid> = (0..2_000).map(|_| HoldToken::generate().0).collect();
    assert!(tokens.iter().all(|t| t.get_version_num() == 7));
    assert!(tokens.windows(2).all(|w| millis(&w[0]) <= millis(&w[1])), "the timestamps never go back");
    let steps = tokens
        .windows(2)
        .filter(|w| millis(&w[0]) == millis(&w[1]) && payload(&w[1]).abs_diff(payload(&w[0])) < 1 << 40)
        .count();
    assert_eq!(steps, 0, "a token's random part is not a step from the previous one's");
    let distinct: std::collections::HashSet<u128> = tokens.iter().map(payload).collect();
    assert_eq!(distinct.len(), tokens.len());

    let orders: Vec<Uuid> = (0..2_000).map(|_| OrderId::generate().0).collect();
    assert!(orders.iter().all(|o| o.get_version_num() == 7));
    assert!(orders.windows(2).all(|w| w[0] < w[1]), "order ids ascend, so their indexes grow at one edge");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn any_basket_is_accepted_only_when_it_is_distinct_on_sale_and_within_the_cap(
            raw in prop::collection::vec(prop_oneof![0i64..40, any::<i64>()], 0..12),
            max in 0usize..10,
        ) {
            let cat = catalogue(&(1..=30).collect::<Vec<_>>());
            match Basket::parse(&raw, max, &cat) {
                Ok(basket) => {
                    let distinct: HashSet<i64> = raw.iter().copied().collect();
                    prop_assert!(!raw.is_empty() && raw.len() <= max && distinct.len() == raw.len());
                    prop_assert!(raw.iter().all(|&s| (1..=30).contains(&s)));
                    prop_assert_eq!(basket.seats().iter().map(|s| s.0).collect::<Vec<_>>(), raw);
                }
                Err(BasketError::Empty) => prop_assert!(raw.is_empty()),
                Err(BasketError::TooMany { max: m }) => prop_assert!(raw.len() > m && m == max),
                Err(BasketError::Duplicate(seat)) => prop_assert!(raw.iter().filter(|&&s| s == seat.0).count() > 1),
                Err(BasketError::NotOnSale(seat)) => prop_assert!(!(1..=30).contains(&seat.0)),
            }
        }
    }
}
