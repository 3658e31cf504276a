//! How a fan picks seats from the map, as fans do: most go for the best (dearest) sections, so hot seats
//! collide; a party wants seats side by side in one row; seats a 409 named, or the map showed taken, are
//! avoided. Pure: the randomness comes in as arguments, so it is tested without a server.
//!
//! The map's layout (sections, rows, numbers, prices) is static, so the process reads it once and shares it,
//! as a browser or CDN caches it; each fan keeps only which seats its copy of the map showed available (one
//! flag per seat). A 20,000-seat map is 4 MB of JSON: parsing it borrowed, never into owned values, keeps
//! 20,000 fans within memory.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;

/// One seat-map entry, borrowed from the response body.
#[derive(Debug, Deserialize)]
struct SeatIn<'a> {
    seat_id: i64,
    #[serde(borrow)]
    section: &'a str,
    #[serde(borrow)]
    row: &'a str,
    number: i32,
    price_cents: i64,
    #[serde(borrow)]
    status: &'a str,
}

#[derive(Debug, Deserialize)]
struct MapIn<'a> {
    #[serde(borrow)]
    seats: Vec<SeatIn<'a>>,
}

/// The static part of an event's map, shared by every fan.
#[derive(Debug)]
pub struct Layout {
    /// Seat ids, in map order (a seat's position indexes every per-seat vector).
    ids: Vec<i64>,
    position: HashMap<i64, usize>,
    /// Rows: positions sorted by seat number, with their section.
    rows: Vec<(usize, Vec<usize>)>,
    /// Sections, dearest first: (name, price of its dearest seat).
    sections: Vec<(String, i64)>,
    number: Vec<i32>,
}

/// Which seats one fan's copy of the map showed available, by position.
pub type Available = Vec<bool>;

impl Layout {
    /// Reads the layout from a seat-map body.
    pub fn parse(body: &[u8]) -> Result<Layout, serde_json::Error> {
        let map: MapIn = serde_json::from_slice(body)?;
        let mut section_index: HashMap<&str, usize> = HashMap::new();
        let mut section_price: Vec<(String, i64)> = Vec::new();
        let mut rows: BTreeMap<(usize, &str), Vec<usize>> = BTreeMap::new();
        for (pos, s) in map.seats.iter().enumerate() {
            let next = section_index.len();
            let section = *section_index.entry(s.section).or_insert(next);
            if section == section_price.len() {
                section_price.push((s.section.to_owned(), 0));
            }
            section_price[section].1 = section_price[section].1.max(s.price_cents);
            rows.entry((section, s.row)).or_default().push(pos);
        }
        let number: Vec<i32> = map.seats.iter().map(|s| s.number).collect();
        let rows = rows
            .into_iter()
            .map(|((section, _), mut positions)| {
                positions.sort_by_key(|p| number[*p]);
                (section, positions)
            })
            .collect();
        let ids: Vec<i64> = map.seats.iter().map(|s| s.seat_id).collect();
        let position = ids.iter().enumerate().map(|(p, id)| (*id, p)).collect();
        Ok(Layout { ids, position, rows, sections: section_price, number })
    }

    /// Which seats a seat-map body shows available (seats unknown to the layout are ignored).
    pub fn available(&self, body: &[u8]) -> Result<Available, serde_json::Error> {
        let map: MapIn = serde_json::from_slice(body)?;
        let mut available = vec![false; self.ids.len()];
        for (i, s) in map.seats.iter().enumerate() {
            let pos =
                if self.ids.get(i) == Some(&s.seat_id) { Some(i) } else { self.position.get(&s.seat_id).copied() };
            if let Some(pos) = pos {
                available[pos] = s.status == "available";
            }
        }
        Ok(available)
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
        candidates.sort_by(|a, b| self.sections[*b].1.cmp(&self.sections[*a].1).then(a.cmp(b)));
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

    /// Three sections (A dearest), two rows of five each; seat ids 1..=30 in map order.
    fn body(held: &[i64]) -> Vec<u8> {
        let mut seats = Vec::new();
        let mut id = 0;
        for (section, price) in [("A", 12000), ("B", 7500), ("C", 4500)] {
            for row in ["1", "2"] {
                for number in 1..=5 {
                    id += 1;
                    let status = if held.contains(&id) { "held" } else { "available" };
                    seats.push(serde_json::json!({
                        "seat_id": id, "section": section, "row": row, "number": number,
                        "price_cents": price, "status": status, "label": format!("{section} {row} {number}"),
                    }));
                }
            }
        }
        serde_json::to_vec(&serde_json::json!({ "event_id": 1, "version": 1, "seats": seats })).expect("json")
    }

    fn setup(held: &[i64]) -> (Layout, Available) {
        let layout = Layout::parse(&body(&[])).expect("layout");
        let available = layout.available(&body(held)).expect("available");
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
    fn party_sizes_run_from_one_to_six() {
        assert_eq!(party_size(0.0), 1);
        assert_eq!(party_size(0.3), 2);
        assert_eq!(party_size(0.999), 6);
    }
}
