//! Ranks sharing one GPU (under MPS) share its SMs: how many share each
//! GPU, and each rank's share, which sizes a program's grid so that every
//! rank's blocks are resident at once.

/// A rank's GPU as the setup sees it: (host, GPU UUID, SM count).
pub type RankGpu<'a> = (&'a str, &'a str, u32);

/// (the most ranks sharing one GPU, each rank's share of its GPU's SMs with
/// the smallest share winning, at least 1): one block per SM per rank
/// leaves room for the other ranks' blocks under MPS. Ranks share a GPU
/// when host and UUID match.
pub fn sm_share(gpus: &[RankGpu]) -> (u32, u32) {
    let sharing = |g: &RankGpu| ranks_sharing(gpus, (g.0, g.1));
    let max_ranks_on_gpu = gpus.iter().map(sharing).max().unwrap_or(1);
    let share = gpus
        .iter()
        .map(|g| g.2 / sharing(g))
        .min()
        .unwrap_or(1)
        .max(1);
    (max_ranks_on_gpu, share)
}

/// How many of `gpus` run on the GPU `(host, uuid)`.
pub fn ranks_sharing(gpus: &[RankGpu], (host, uuid): (&str, &str)) -> u32 {
    gpus.iter().filter(|g| g.0 == host && g.1 == uuid).count() as u32
}
