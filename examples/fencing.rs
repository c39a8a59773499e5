//! Eight tasks sell from one stock counter under the lock. The count is read,
//! then written back: without the lock, two sellers would sell the same item.
//! Each write carries a fencing token that the store checks, so a seller
//! paused past its lock's validity cannot write a stale count.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001/,... cargo run --example fencing
//! ```

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script, aio::MultiplexedConnection};
use redlock_quorum::Redlock;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `REDLOCK_NODES` (comma-separated URLs), or five local nodes.
fn nodes() -> Vec<String> {
    match std::env::var("REDLOCK_NODES") {
        Ok(list) => redlock_quorum::split_node_list(&list),
        Err(_) => (7001..=7005)
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect(),
    }
}

/// The store's write, refused when a later lock holder has written already.
static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return 0 end
         redis.call('SET', KEYS[2], ARGV[1])
         redis.call('SET', KEYS[1], ARGV[2])
         return 1",
    )
});

/// Sells until the stock is gone; returns how many items this seller sold.
async fn sell(redlock: Redlock, mut store: MultiplexedConnection) -> Result<u64> {
    let mut sold = 0;
    loop {
        let lock = redlock.lock("stock:sku-42", Duration::from_secs(2)).await?;
        let fence = redlock.fencing_token(&lock).await?;
        let stock: u64 = store.get("sku-42:stock").await?;
        if stock > 0 {
            let mut write = WRITE.key("sku-42:stock");
            write.key("sku-42:fence").arg(fence).arg(stock - 1);
            sold += write.invoke_async::<u64>(&mut store).await?;
        }
        redlock.unlock(&lock).await?;
        if stock == 0 {
            return Ok(sold);
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let nodes = nodes();
    // Short locks that many contend for: retry after a few milliseconds.
    let redlock = Redlock::builder(nodes.clone())
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(5))
        .retry_count(1000)
        .build()?;
    // The stock lives in the first node here; in real life, your database.
    let mut store = redis::Client::open(nodes[0].as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let () = store.set("sku-42:stock", 50).await?;

    let sellers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(sell(redlock.clone(), store.clone())))
        .collect();
    let mut total = 0;
    for (i, seller) in sellers.into_iter().enumerate() {
        let sold = seller.await??;
        println!("seller {i} sold {sold}");
        total += sold;
    }
    let left: u64 = store.get("sku-42:stock").await?;
    println!("sold {total} of 50, {left} left");
    assert_eq!((total, left), (50, 0));
    Ok(())
}
