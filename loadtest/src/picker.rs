//! How a fan picks seats from the map, as fans do: most go for the best (dearest) sections, so hot seats
//! collide; a party wants seats side by side in one row; seats a 409 named, or the map showed taken, are
//! avoided. Pure: the randomness comes in as arguments, so it is tested without a server.
//!
//! The map's layout (sections, rows, numbers, prices) is static: the process reads it once from booking's
//! layout answer and shares it, as a browser or CDN caches it; which seats are free comes from the live map
//! (`crate::map`), one flag per seat.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;

/// Booking's layout answer (`GET /events/{id}/seats/layout/{version}`): one array per field.
#[derive(Debug, Deserialize)]
struct LayoutIn {
    ticket_types: Vec<TicketTypeIn>,
    seats: SeatsIn,
}

#[derive(Debug, Deserialize)]
struct TicketTypeIn {
    ticket_type_id: i64,
    price_cents: i64,
}

#[derive(Debug, Deserialize)]
struct SeatsIn {
    seat_id: Vec<i64>,
    section: Vec<u32>,
    row: Vec<String>,
    number: Vec<i32>,
    ticket_type_id: Vec<i64>,
}

/// The static part of an event's map, shared by every fan.
#[derive(Debug)]
pub struct Layout {
    /// Seat ids, in map order (a seat's position indexes every per-seat vector, and the status's entries).
    ids: Vec<i64>,
    position: HashMap<i64, usize>,
    /// Rows: positions sorted by seat number, with their section.
    rows: Vec<(usize, Vec<usize>)>,
    /// Sections by index: the price of its dearest seat.
    sections: Vec<i64>,
    number: Vec<i32>,
}

/// Which seats one fan's copy of the map shows available, by position.
pub type Available = Vec<bool>;

impl Layout {
    /// Reads booking's layout answer.
    pub fn parse(body: &[u8]) -> Result<Layout, serde_json::Error> {
        let layout: LayoutIn = serde_json::from_slice(body)?;
        let seats = layout.seats;
        let n = seats.seat_id.len();
        if [seats.section.len(), seats.row.len(), seats.number.len(), seats.ticket_type_id.len()]
            .iter()
            .any(|l| *l != n)
        {
            return Err(serde::de::Error::custom("the layout's arrays differ in length"));
        }
        let price: HashMap<i64, i64> = layout.ticket_types.iter().map(|t| (t.ticket_type_id, t.price_cents)).collect();
        let mut sections: Vec<i64> = Vec::new();
        let mut rows: BTreeMap<(usize, &str), Vec<usize>> = BTreeMap::new();
        for pos in 0..n {
            let section = seats.section[pos] as usize;
            if sections.len() <= section {
                sections.resize(section + 1, 0);
            }
            let cents = price.get(&seats.ticket_type_id[pos]).copied().unwrap_or(0);
            sections[section] = sections[section].max(cents);
            rows.entry((section, seats.row[pos].as_str())).or_default().push(pos);
        }
        let number = seats.number.clone();
        let rows = rows
            .into_iter()
            .map(|((section, _), mut positions)| {
                positions.sort_by_key(|p| number[*p]);
                (section, positions)
            })
            .collect();
        let position = seats.seat_id.iter().enumerate().map(|(p, id)| (*id, p)).collect();
        Ok(Layout { ids: seats.seat_id, position, rows, sections, number })
    }

    /// How many seats the layout has (and the status has entries).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The seat at a position.
    pub fn id(&self, pos: usize) -> Option<i64> {
        self.ids.get(pos).copied()
    }

    /// A seat's position in the layout.
    pub fn position(&self, seat: i64) -> Option<usize> {
        self.position.get(&seat).copied()
    }

    /// Picks `party` seats. `best` fans take one of the three dearest sections with room, others any section
    /// (`choice` in 0..1 chooses it); within the section, adjacent seats in one of the five front-most rows that
    /// have them (`spread` in 0..1 chooses which), else any free seats of the section. `None` when nothing fits.
    pub fn pick(
        &self,
        available: &Available,
        taken: &HashSet<i64>,
        party: usize,
        best: bool,
        choice: f64,
        spread: f64,
    ) -> Option<Vec<i64>> {
        let free = |pos: usize| available[pos] && !taken.contains(&self.ids[pos]);
        let mut room = vec![0usize; self.sections.len()];
        for (section, positions) in &self.rows {
            room[*section] += positions.iter().filter(|p| free(**p)).count();
        }
        let mut candidates: Vec<usize> = (0..self.sections.len()).filter(|s| room[*s] >= party).collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_by(|a, b| self.sections[*b].cmp(&self.sections[*a]).then(a.cmp(b)));
        let limit = if best { candidates.len().min(3) } else { candidates.len() };
        let section = candidates[((choice * limit as f64) as usize).min(limit - 1)];
        let rows: Vec<&Vec<usize>> = self.rows.iter().filter(|(s, _)| *s == section).map(|(_, p)| p).collect();
        let mut runs: Vec<Vec<i64>> = Vec::new();
        for positions in &rows {
            let free_here: Vec<usize> = positions.iter().copied().filter(|p| free(*p)).collect();
            let run =
                free_here.windows(party).find(|w| w.windows(2).all(|p| self.number[p[1]] == self.number[p[0]] + 1));
            if let Some(run) = run {
                runs.push(run.iter().map(|p| self.ids[*p]).collect());
                if runs.len() == 5 {
                    break;
                }
            }
        }
        if !runs.is_empty() {
            let i = ((spread * runs.len() as f64) as usize).min(runs.len() - 1);
            return Some(runs.swap_remove(i));
        }
        Some(
            rows.iter().flat_map(|p| p.iter()).copied().filter(|p| free(*p)).take(party).map(|p| self.ids[p]).collect(),
        )
    }
}

/// A party size from 1 to 6, most often 2 (`roll` in 0..1).
pub fn party_size(roll: f64) -> usize {
    const CUMULATIVE: [(f64, usize); 6] = [(0.15, 1), (0.55, 2), (0.70, 3), (0.88, 4), (0.95, 5), (1.0, 6)];
    CUMULATIVE.iter().find(|(p, _)| roll < *p).map_or(6, |(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three sections (A dearest), two rows of five each; seat ids 1..=30 in map order, as booking's layout.
    fn layout() -> Layout {
        let (mut ids, mut section, mut row, mut number, mut ticket) = (vec![], vec![], vec![], vec![], vec![]);
        let mut id = 0;
        for (s, t) in [(0, 1), (1, 2), (2, 3)] {
            for r in ["1", "2"] {
                for n in 1..=5 {
                    id += 1;
                    ids.push(id);
                    section.push(s);
                    row.push(r);
                    number.push(n);
                    ticket.push(t);
                }
            }
        }
        let body = serde_json::json!({
            "event_id": 1, "catalogue_version": 1, "currency": "EUR", "sections": ["A", "B", "C"],
            "ticket_types": [
                {"ticket_type_id": 1, "name": "A", "price_cents": 12000},
                {"ticket_type_id": 2, "name": "B", "price_cents": 7500},
                {"ticket_type_id": 3, "name": "C", "price_cents": 4500},
            ],
            "seats": {"seat_id": ids, "label": ids.iter().map(|i| format!("seat {i}")).collect::<Vec<_>>(),
                "section": section, "row": row, "number": number, "x": number, "y": number,
                "accessible": vec![false; 30], "ticket_type_id": ticket},
        });
        Layout::parse(&serde_json::to_vec(&body).expect("json")).expect("layout")
    }

    fn setup(held: &[i64]) -> (Layout, Available) {
        let layout = layout();
        let available = (1..=30).map(|id| !held.contains(&id)).collect();
        (layout, available)
    }

    #[test]
    fn a_party_sits_together_in_the_best_section() {
        let (layout, available) = setup(&[]);
        assert_eq!(layout.pick(&available, &HashSet::new(), 3, true, 0.0, 0.0), Some(vec![1, 2, 3]));
    }

    #[test]
    fn fans_spread_over_the_front_rows() {
        let (layout, available) = setup(&[]);
        let first = layout.pick(&available, &HashSet::new(), 2, true, 0.0, 0.0).expect("seats");
        let other = layout.pick(&available, &HashSet::new(), 2, true, 0.0, 0.99).expect("seats");
        assert_ne!(first, other, "another spread, another row");
    }

    #[test]
    fn named_and_taken_seats_are_avoided() {
        let (layout, available) = setup(&[1]);
        let taken: HashSet<i64> = [3].into();
        let picked = layout.pick(&available, &taken, 2, true, 0.0, 0.0).expect("seats");
        assert!(!picked.contains(&1) && !picked.contains(&3), "{picked:?}");
        assert_eq!(picked.len(), 2);
    }

    #[test]
    fn nothing_fits_when_every_section_is_too_full() {
        let (layout, available) = setup(&[]);
        let taken: HashSet<i64> = (1..=30).collect();
        assert_eq!(layout.pick(&available, &taken, 1, true, 0.5, 0.5), None);
        assert!(layout.pick(&available, &HashSet::new(), 11, false, 0.5, 0.5).is_none());
    }

    #[test]
    fn a_layout_whose_arrays_differ_in_length_is_refused() {
        let body = br#"{"ticket_types": [], "seats": {"seat_id": [1, 2], "section": [0], "row": ["A", "A"],
            "number": [1, 2], "ticket_type_id": [1, 1]}}"#;
        assert!(Layout::parse(body).is_err());
        assert_eq!(layout().len(), 30);
        assert_eq!(layout().position(7), Some(6));
    }

    #[test]
    fn party_sizes_run_from_one_to_six() {
        assert_eq!(party_size(0.0), 1);
        assert_eq!(party_size(0.3), 2);
        assert_eq!(party_size(0.999), 6);
    }
}
