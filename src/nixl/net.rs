//! One rank's NIXL side over one window, for programs of N ranks: its agent,
//! the window's registration, the local memory view over it and the remote
//! view with one element per rank (NIXL EP's layout: element `r` is rank
//! `r`'s window, absent ranks a null agent), and the card a rank publishes
//! so that others can connect to it.
//!
//! Peers come and go between steps: [`Net::connect`] loads a new peer's
//! metadata, [`Net::retain`] drops those a phase no longer has, and
//! [`Net::rebuild`] puts the remote view over the connected peers in place.
//! The caller rebuilds only while no kernel runs (its stream
//! synchronised), so no view a kernel uses is destroyed; the old view is
//! dropped after the new one exists. Connecting can happen ahead, while
//! kernels use the current view: [`Net::prepare`] makes the next phase's
//! view beside it, and the rebuild at the phase's begin then only swaps.

use anyhow::{Context as _, Result, bail};
use nixl_sys::{MemView, NixlDescriptor, RegistrationHandle};

use super::agent::{UcxAgent, create_ucx_agent};
use super::serdes::{Desc, DescList, MemType};
use super::view::{RankBuffer, Views, load_peer, prep_local, prep_remote_ranks};

/// What a rank publishes so that others can connect to it: its agent's
/// name and metadata (`getLocalMD`) and its window (one VRAM descriptor).
/// On the wire: addr, len, dev_id (u64 little-endian each), the name's
/// length (u32), the name, then the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCard {
    pub agent: String,
    pub window: Desc,
    pub metadata: Vec<u8>,
}

impl PeerCard {
    /// The card on the wire (see the type).
    pub fn encode(&self) -> Vec<u8> {
        let w = &self.window;
        let mut out = Vec::with_capacity(28 + self.agent.len() + self.metadata.len());
        for v in [w.addr, w.len, w.dev_id] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.agent.len() as u32).to_le_bytes());
        out.extend_from_slice(self.agent.as_bytes());
        out.extend_from_slice(&self.metadata);
        out
    }
    /// A card from the wire; errors name what is missing.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        let short = || format!("{} bytes are too few for a peer card", b.len());
        let u64_at = |i: usize| -> Result<u64, String> {
            let s = b.get(i..i + 8).ok_or_else(short)?;
            Ok(u64::from_le_bytes(s.try_into().unwrap()))
        };
        let window = Desc {
            addr: u64_at(0)?,
            len: u64_at(8)?,
            dev_id: u64_at(16)?,
        };
        let n = b.get(24..28).ok_or_else(short)?;
        let n = u32::from_le_bytes(n.try_into().unwrap()) as usize;
        let agent = b.get(28..28 + n).ok_or_else(short)?;
        let agent = String::from_utf8(agent.to_vec()).map_err(|e| e.to_string())?;
        Ok(Self {
            agent,
            window,
            metadata: b[28 + n..].to_vec(),
        })
    }
}

/// The agent, the registration and the views. Fields drop in declaration
/// order: views, then the registration, then the agent; the window itself
/// belongs to the caller and must outlive this.
pub struct Net {
    remote: Option<MemView>,
    /// The elements `remote` was made from.
    remote_elements: Vec<RankBuffer>,
    /// The next phase's remote view, prepared ahead, and the elements it was
    /// made from ([`Net::prepare`]).
    pending: Option<(Vec<RankBuffer>, Option<MemView>)>,
    local: Option<MemView>,
    reg: Option<RegistrationHandle>,
    /// Element `r` of the remote view: rank `r`'s window and agent, if
    /// connected.
    peers: Vec<RankBuffer>,
    nixl: UcxAgent,
    /// Every rank's window has this many bytes (one configuration).
    window_len: u64,
}

impl Net {
    /// Creates agent `name`, registers `window` (VRAM, described by
    /// `desc`) and prepares the local view; returns it with this rank's
    /// card. `capacity` = elements of the remote view.
    pub fn open(
        name: &str,
        window: &impl NixlDescriptor,
        desc: Desc,
        capacity: u32,
    ) -> Result<(Self, PeerCard)> {
        let nixl = create_ucx_agent(name)?;
        let reg = nixl
            .agent
            .register_memory(window, None)
            .context("registering the window (VRAM)")?;
        let own = DescList::new(MemType::Vram, vec![desc]);
        // SAFETY: the window stays registered until this view drops (close).
        let local = unsafe { prep_local(&nixl.agent, &nixl.backend, &own)? };
        let card = PeerCard {
            agent: name.to_string(),
            window: desc,
            metadata: nixl.agent.get_local_md()?,
        };
        let net = Self {
            remote: None,
            remote_elements: vec![None; capacity as usize],
            pending: None,
            local: Some(local),
            reg: Some(reg),
            peers: vec![None; capacity as usize],
            nixl,
            window_len: desc.len,
        };
        Ok((net, card))
    }

    /// Whether rank `r`'s element is agent `agent`'s window.
    pub fn has(&self, r: u32, agent: &str) -> bool {
        matches!(&self.peers[r as usize], Some((_, name)) if name == agent)
    }

    /// Whether rank `r`'s element holds some agent's window.
    pub fn occupied(&self, r: u32) -> bool {
        self.peers[r as usize].is_some()
    }

    /// Loads rank `r`'s metadata (waiting up to `timeout` until usable) and
    /// makes its window element `r` of the next [`Net::rebuild`]; nothing
    /// to do when that element is `card`'s agent already. Errors: another
    /// configuration's window, an element held by another agent (drop it
    /// first), the metadata not usable in time.
    pub fn connect(&mut self, r: u32, card: &PeerCard, timeout: std::time::Duration) -> Result<()> {
        let ours = self.window_len;
        if card.window.len != ours {
            bail!(
                "rank {r} published a window of {} bytes, expected {ours}: it runs another configuration",
                card.window.len
            );
        }
        match &self.peers[r as usize] {
            Some((_, name)) if *name == card.agent => return Ok(()),
            Some((_, name)) => bail!("element {r} of the remote view is still {name}'s"),
            None => {}
        }
        load_peer(&self.nixl.agent, &card.metadata, &card.agent, timeout)
            .with_context(|| format!("connecting to rank {r} ({})", card.agent))?;
        self.peers[r as usize] = Some((card.window, card.agent.clone()));
        Ok(())
    }

    /// Drops every element but `keep`'s (rank, agent) pairs from the next
    /// [`Net::rebuild`]; returns the dropped agents' names, whose metadata
    /// that rebuild invalidates.
    pub fn retain(&mut self, keep: &[(u32, String)]) -> Vec<String> {
        let mut dropped = Vec::new();
        for (r, slot) in self.peers.iter_mut().enumerate() {
            let kept = slot
                .as_ref()
                .is_some_and(|(_, name)| keep.iter().any(|(k, a)| *k as usize == r && a == name));
            if !kept {
                dropped.extend(slot.take().map(|(_, name)| name));
            }
        }
        dropped
    }

    /// The view's elements over `keep`'s connected peers (all when `None`).
    fn elements(&self, keep: Option<&[(u32, String)]>) -> Vec<RankBuffer> {
        let kept = |r: usize, name: &String| {
            keep.is_none_or(|k| k.iter().any(|(kr, a)| *kr as usize == r && a == name))
        };
        (self.peers.iter().enumerate())
            .map(|(r, p)| p.clone().filter(|(_, name)| kept(r, name)))
            .collect()
    }

    /// A remote view over `elements`; `None` when every element is null.
    ///
    /// # Safety
    /// Every peer in `elements` keeps its window registered while the view
    /// exists.
    unsafe fn view_over(&self, elements: &[RankBuffer]) -> Result<Option<MemView>> {
        if elements.iter().all(Option::is_none) {
            return Ok(None);
        }
        // SAFETY: as this function's contract.
        let view = unsafe { prep_remote_ranks(&self.nixl.agent, &self.nixl.backend, elements)? };
        Ok(Some(view))
    }

    /// Prepares, ahead, the remote view the next phase will use: over the
    /// connected peers among `keep`'s (rank, agent) pairs. The current view
    /// stays as it is, so kernels may use it meanwhile; [`Net::rebuild`]
    /// swaps the prepared one in if the connected peers are still the same
    /// then. Nothing to do when the same view is prepared already.
    ///
    /// # Safety
    /// Every peer kept keeps its window registered while the view exists.
    pub unsafe fn prepare(&mut self, keep: &[(u32, String)]) -> Result<()> {
        let elements = self.elements(Some(keep));
        if elements == self.remote_elements {
            // The next phase keeps the current view.
            self.pending = None;
            return Ok(());
        }
        if self.pending.as_ref().is_some_and(|(e, _)| *e == elements) {
            return Ok(());
        }
        // SAFETY: as this function's contract.
        let view = unsafe { self.view_over(&elements)? };
        self.pending = Some((elements, view));
        Ok(())
    }

    /// Puts the remote view over the connected peers in place (the current
    /// one if its elements are the same, else the one prepared ahead if
    /// they match, else a new one) and drops the old one, then invalidates
    /// the metadata of `departed` agents.
    ///
    /// # Safety
    /// No kernel may be running that uses the current views (synchronise
    /// the stream first), and every connected peer keeps its window
    /// registered while the new view exists.
    pub unsafe fn rebuild(&mut self, departed: &[String]) -> Result<()> {
        let elements = self.elements(None);
        let pending = self.pending.take();
        if elements != self.remote_elements {
            self.remote = match pending {
                Some((e, view)) if e == elements => view,
                // SAFETY: as this function's contract.
                _ => unsafe { self.view_over(&elements)? },
            };
            self.remote_elements = elements;
        }
        for name in departed {
            let _ = self.nixl.agent.invalidate_remote_md(name);
        }
        Ok(())
    }

    /// The local and the remote view as the kernels take them.
    pub fn views(&self) -> Views {
        Views::of(self.local.as_ref(), self.remote.as_ref())
    }

    /// Drops both views (no kernel may run), then, after `released` (every
    /// rank dropped its views of our window), the registration and every
    /// peer's metadata.
    pub fn close(mut self, released: impl FnOnce() -> Result<()>) -> Result<()> {
        self.remote = None;
        self.pending = None;
        self.local = None;
        released()?;
        self.reg = None;
        for (_, name) in self.peers.iter().flatten() {
            let _ = self.nixl.agent.invalidate_remote_md(name);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_survives_the_wire() {
        let card = PeerCard {
            agent: "ep-rank-3.2".into(),
            window: Desc {
                addr: 0x7f00_0000_1000,
                len: 1 << 20,
                dev_id: 1,
            },
            metadata: vec![1, 2, 3, 0, 255],
        };
        assert_eq!(PeerCard::decode(&card.encode()).unwrap(), card);
        assert!(PeerCard::decode(&card.encode()[..20]).is_err());
    }
}
