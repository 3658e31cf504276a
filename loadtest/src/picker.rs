//! How a fan picks seats from the map, as fans do: most go for the best (dearest) sections, so hot seats
//! collide; a party wants seats side by side in one row; seats a 409 named, or the map showed taken, are
//! avoided. Pure: the randomness comes in as arguments, so it is tested without a server.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

/// The part of a seat-map entry a fan looks at.
#[derive(Debug, Clone, Deserialize)]
pub struct Seat {
    pub seat_id: i64,
    pub section: String,
    pub row: String,
    pub number: i32,
    pub price_cents: i64,
    pub status: String,
}

/// The seat map's body, as far as fans read it.
#[derive(Debug, Clone, Deserialize)]
pub struct SeatMap {
    pub seats: Vec<Seat>,
}

/// A row of available seats: (section, row) -> seats by number.
type Rows<'a> = BTreeMap<(&'a str, &'a str), Vec<&'a Seat>>;

/// Picks `party` seats. `best` fans take one of the three dearest sections with room, others any section
/// (`choice` in 0..1 chooses it); within the section, adjacent seats in one of the five front-most rows that
/// have them (`spread` in 0..1 chooses which), else any seats of the section. `None` when nothing fits.
pub fn pick(
    map: &SeatMap,
    taken: &HashSet<i64>,
    party: usize,
    best: bool,
    choice: f64,
    spread: f64,
) -> Option<Vec<i64>> {
    let free = |s: &&Seat| s.status == "available" && !taken.contains(&s.seat_id);
    let mut rows: Rows = BTreeMap::new();
    for seat in map.seats.iter().filter(free) {
        rows.entry((seat.section.as_str(), seat.row.as_str())).or_default().push(seat);
    }
    // Sections with at least `party` free seats, dearest first.
    let mut sections: BTreeMap<&str, (i64, usize)> = BTreeMap::new();
    for ((section, _), seats) in &rows {
        let entry = sections.entry(section).or_insert((0, 0));
        entry.0 = entry.0.max(seats.iter().map(|s| s.price_cents).max().unwrap_or(0));
        entry.1 += seats.len();
    }
    let mut candidates: Vec<(&str, i64)> =
        sections.into_iter().filter(|(_, (_, n))| *n >= party).map(|(name, (price, _))| (name, price)).collect();
    if candidates.is_empty() {
        return None;
    }
    candidates.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let index = if best {
        // The best few sections, where most fans crowd.
        ((choice * 3.0) as usize).min(candidates.len() - 1)
    } else {
        ((choice * candidates.len() as f64) as usize).min(candidates.len() - 1)
    };
    let section = candidates[index].0;
    let in_section: Vec<&Vec<&Seat>> = rows.iter().filter(|((s, _), _)| *s == section).map(|(_, v)| v).collect();
    let mut runs: Vec<Vec<i64>> = Vec::new();
    for seats in &in_section {
        let mut sorted: Vec<&&Seat> = seats.iter().collect();
        sorted.sort_by_key(|s| s.number);
        if let Some(run) = sorted.windows(party).find(|w| w.windows(2).all(|p| p[1].number == p[0].number + 1)) {
            runs.push(run.iter().map(|s| s.seat_id).collect());
            if runs.len() == 5 {
                break;
            }
        }
    }
    if !runs.is_empty() {
        let i = ((spread * runs.len() as f64) as usize).min(runs.len() - 1);
        return Some(runs.swap_remove(i));
    }
    Some(in_section.iter().flat_map(|v| v.iter()).take(party).map(|s| s.seat_id).collect())
}

/// A party size from 1 to 6, most often 2 (`roll` in 0..1).
pub fn party_size(roll: f64) -> usize {
    const CUMULATIVE: [(f64, usize); 6] = [(0.15, 1), (0.55, 2), (0.70, 3), (0.88, 4), (0.95, 5), (1.0, 6)];
    CUMULATIVE.iter().find(|(p, _)| roll < *p).map_or(6, |(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> SeatMap {
        let mut seats = Vec::new();
        let mut id = 0;
        for (section, price) in [("A", 12000), ("B", 7500), ("C", 4500)] {
            for row in ["1", "2"] {
                for number in 1..=5 {
                    id += 1;
                    seats.push(Seat {
                        seat_id: id,
                        section: section.into(),
                        row: row.into(),
                        number,
                        price_cents: price,
                        status: "available".into(),
                    });
                }
            }
        }
        SeatMap { seats }
    }

    #[test]
    fn a_party_sits_together_in_the_best_section() {
        let picked = pick(&map(), &HashSet::new(), 3, true, 0.0, 0.0).expect("seats");
        assert_eq!(picked, vec![1, 2, 3]);
    }

    #[test]
    fn fans_spread_over_the_front_rows() {
        let first = pick(&map(), &HashSet::new(), 2, true, 0.0, 0.0).expect("seats");
        let other = pick(&map(), &HashSet::new(), 2, true, 0.0, 0.99).expect("seats");
        assert_ne!(first, other, "another spread, another row");
    }

    #[test]
    fn named_and_taken_seats_are_avoided() {
        let mut m = map();
        m.seats[0].status = "held".into();
        let taken: HashSet<i64> = [3].into();
        let picked = pick(&m, &taken, 2, true, 0.0, 0.0).expect("seats");
        assert!(!picked.contains(&1) && !picked.contains(&3), "{picked:?}");
        assert_eq!(picked.len(), 2);
    }

    #[test]
    fn nothing_fits_when_every_section_is_too_full() {
        let taken: HashSet<i64> = (1..=30).collect();
        assert_eq!(pick(&map(), &taken, 1, true, 0.5, 0.5), None);
        assert!(pick(&map(), &HashSet::new(), 11, false, 0.5, 0.5).is_none());
    }

    #[test]
    fn party_sizes_run_from_one_to_six() {
        assert_eq!(party_size(0.0), 1);
        assert_eq!(party_size(0.3), 2);
        assert_eq!(party_size(0.999), 6);
    }
}
