//! The pre-queue draw, recomputable by anyone: the same algorithm `lua/lib/queue_shuffle.lua` runs in Redis.
//!
//! A Fisher-Yates shuffle of the accounts in join order, driven by the Park-Miller "minimal standard"
//! generator `x <- x * 48271 mod (2^31 - 1)` from the recorded seed. Both sides use exact integer arithmetic
//! (in Lua every intermediate is below 2^47, exact in a double), so the order is identical.

/// The modulus of the generator, 2^31 - 1.
pub const MODULUS: u64 = 2_147_483_647;

/// A valid seed (1 ..= 2^31 - 2) from any 64-bit value.
pub fn seed_from(raw: u64) -> u64 {
    raw % (MODULUS - 1) + 1
}

/// The pre-queue order drawn with `seed`: element k (from 0) gets place `base + k + 1`.
pub fn draw<T>(mut join_order: Vec<T>, seed: u64) -> Vec<T> {
    let mut x = seed;
    for i in (2..=join_order.len()).rev() {
        x = x * 48_271 % MODULUS;
        let j = (x % i as u64) as usize; // 0-based: Lua's (x mod i) + 1
        join_order.swap(i - 1, j);
    }
    join_order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_a_permutation_fixed_by_its_seed() {
        let order: Vec<u32> = (1..=50).collect();
        let a = draw(order.clone(), 12_345);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, order, "a permutation");
        assert_ne!(a, order, "not the join order");
        assert_eq!(a, draw(order.clone(), 12_345), "same seed, same order");
        assert_ne!(a, draw(order, 12_346), "another seed, another order");
    }

    #[test]
    fn seeds_stay_in_the_generators_range() {
        for raw in [0, 1, MODULUS - 2, MODULUS - 1, MODULUS, u64::MAX] {
            let seed = seed_from(raw);
            assert!((1..MODULUS).contains(&seed), "{raw} -> {seed}");
        }
    }

    #[test]
    fn empty_and_single_queues_are_unchanged() {
        assert!(draw(Vec::<u8>::new(), 7).is_empty());
        assert_eq!(draw(vec!["a"], 7), vec!["a"]);
    }
}
