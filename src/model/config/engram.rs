//! Engram table geometry: hash columns, the hash primes of each layer
//! (spec §8.2) and the check that each table's row count is the sum of its
//! primes; with the deterministic 64-bit primality test they need.
//!
//! Invariant: primes are handed out in one increasing sequence above
//! `hash_space` − 1, layer after layer in `layer_ids` order, never reused;
//! changing that order changes every table size.

use super::error::ConfigError;
use super::keys;
use super::types::EngramConfig;
use super::validate::ENGRAM_PRIMES_LIMIT;

impl EngramConfig {
    /// Hash columns per layer: n-gram orders 2 ..= `max_ngram` × heads.
    pub fn columns(&self) -> usize {
        self.max_ngram.saturating_sub(1) * self.n_heads
    }

    /// The hash primes of each Engram layer in column order (order, then
    /// head): successive primes above `hash_space` − 1, never reused across
    /// layers (spec §8.2). A layer's table has as many rows as its primes sum.
    pub fn table_primes(&self) -> Result<Vec<Vec<u64>>, ConfigError> {
        let no_prime = || ConfigError::BadValue {
            key: keys::ENGRAM_HASH_SPACE,
            value: self.hash_space.to_string(),
            why: "the hash primes above it do not fit in 64 bits".into(),
        };
        let mut last = self.hash_space.checked_sub(1).ok_or_else(no_prime)?;
        let mut tables = Vec::with_capacity(self.layer_ids.len());
        for _ in &self.layer_ids {
            let mut primes = Vec::with_capacity(self.columns());
            for _ in 0..self.columns() {
                last = next_prime(last).ok_or_else(no_prime)?;
                primes.push(last);
            }
            tables.push(primes);
        }
        Ok(tables)
    }

    pub(super) fn check(&self, vocab_size: usize) -> Result<(), ConfigError> {
        if self.table_rows.len() != self.layer_ids.len() {
            return Err(ConfigError::EngramTableCount {
                tables: self.table_rows.len(),
                layers: self.layer_ids.len(),
            });
        }
        if self.max_ngram < 2 {
            return Err(ConfigError::BadValue {
                key: keys::ENGRAM_MAX_NGRAM,
                value: self.max_ngram.to_string(),
                why: "must be at least 2: n-gram orders 2 and up are looked up".into(),
            });
        }
        if self.hash_space == 0 || self.hash_space > i64::MAX as u64 {
            return Err(ConfigError::BadValue {
                key: keys::ENGRAM_HASH_SPACE,
                value: self.hash_space.to_string(),
                why: "must be positive and fit the int64 hash arithmetic".into(),
            });
        }
        let primes = self.layer_ids.len().saturating_mul(self.columns());
        if primes > ENGRAM_PRIMES_LIMIT {
            return Err(ConfigError::BadValue {
                key: keys::ENGRAM_LAYERS,
                value: format!("{} layers", self.layer_ids.len()),
                why: format!(
                    "{} layers × {} hash columns ((max_ngram − 1) × n_heads) = {primes} hash \
                     primes, above the limit {ENGRAM_PRIMES_LIMIT} (V4.1-Flash uses 48)",
                    self.layer_ids.len(),
                    self.columns()
                ),
            });
        }
        if self.compressed_vocab > vocab_size {
            return Err(ConfigError::Exceeds {
                key: keys::ENGRAM_COMPRESSED_VOCAB,
                value: self.compressed_vocab,
                limit_key: keys::VOCAB_SIZE,
                limit: vocab_size,
            });
        }
        self.check_table_rows()
    }

    fn check_table_rows(&self) -> Result<(), ConfigError> {
        let primes = self.table_primes()?;
        for ((&layer, &rows), primes) in self.layer_ids.iter().zip(&self.table_rows).zip(primes) {
            let expected: u128 = primes.iter().map(|&p| u128::from(p)).sum();
            if u128::from(rows) != expected {
                return Err(ConfigError::EngramTableRows {
                    layer,
                    rows,
                    expected,
                });
            }
        }
        Ok(())
    }
}

/// The smallest prime above `n`.
fn next_prime(n: u64) -> Option<u64> {
    (n.checked_add(1)?..=u64::MAX).find(|&c| is_prime(c))
}

/// Deterministic Miller–Rabin; these twelve bases decide every 64-bit n.
fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    if let Some(&p) = BASES.iter().find(|&&p| n.is_multiple_of(p)) {
        return n == p;
    }
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    BASES.iter().all(|&a| {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            return true;
        }
        (1..s).any(|_| {
            x = mul_mod(x, x, n);
            x == n - 1
        })
    })
}

fn mul_mod(a: u64, b: u64, n: u64) -> u64 {
    // Below n, so the high half is zero.
    crate::numerics::low_u64(u128::from(a) * u128::from(b) % u128::from(n))
}

fn pow_mod(mut base: u64, mut exp: u64, n: u64) -> u64 {
    let mut result = 1;
    base %= n;
    while exp > 0 {
        if exp & 1 == 1 {
            result = mul_mod(result, base, n);
        }
        base = mul_mod(base, base, n);
        exp >>= 1;
    }
    result
}
