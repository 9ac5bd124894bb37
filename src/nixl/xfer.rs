//! Host-API transfer helpers: waiting for a transfer request, and an inbox
//! of notifications matched by tag.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::deadline::{Pace, poll};

use anyhow::{Result, bail};
use nixl_sys::{Agent, NotificationMap, OptArgs, XferRequest, XferStatus};

/// Optional arguments that attach notification `tag` to a transfer: the
/// target receives it once the transfer's data is in place.
pub fn notif_args(tag: &[u8]) -> Result<OptArgs> {
    let mut opt = OptArgs::new()?;
    opt.set_notification_message(tag)?;
    opt.set_has_notification(true)?;
    Ok(opt)
}

/// Posts `req` and polls it to completion, for at most `timeout`; returns
/// the time from post to completion. Errors name the transfer (`what`) and
/// whether it failed or timed out.
pub fn post_and_wait(
    agent: &Agent,
    req: &XferRequest,
    what: &str,
    timeout: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    let in_progress = agent
        .post_xfer_req(req, None)
        .map_err(|e| anyhow::anyhow!("posting {what} failed: {e}"))?;
    if in_progress {
        wait_done(agent, req, what, timeout)?;
    }
    Ok(start.elapsed())
}

/// Polls a posted `req` until it completes, for at most `timeout`.
pub fn wait_done(agent: &Agent, req: &XferRequest, what: &str, timeout: Duration) -> Result<()> {
    poll(
        timeout,
        Pace::Yield,
        || match agent.get_xfer_status(req) {
            Ok(XferStatus::Success) => Ok(Some(())),
            Ok(XferStatus::InProgress) => Ok(None),
            Err(e) => bail!("{what} failed: {e} (the peer may have exited)"),
        },
        |waited| {
            anyhow::anyhow!(
                "{what} did not complete within {waited:?}: the peer stopped progressing (frozen or gone?)"
            )
        },
    )
}

/// Notifications received so far, per sending agent, kept until matched.
///
/// `get_new_notifs` hands each notification over once; a program waiting
/// for several tags must keep the ones it has not asked for yet, or a tag
/// that arrives early is lost. This is that bookkeeping.
#[derive(Default)]
pub struct NotifInbox {
    pending: HashMap<String, Vec<Vec<u8>>>,
}

impl NotifInbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves newly arrived notifications (`get_new_notifs`) into the inbox.
    /// Returns how many arrived.
    pub fn poll(&mut self, agent: &Agent) -> Result<usize> {
        // A fresh map each time: messages may be binary, and nixl-sys can
        // only clear a map by converting its messages to UTF-8 strings.
        let mut map = NotificationMap::new()?;
        agent.get_notifications(&mut map, None)?;
        let agents: Vec<String> = map
            .agents()
            .filter_map(|a| a.ok().map(str::to_string))
            .collect();
        let mut count = 0;
        for a in agents {
            let n = map.get_notifications_size(&a)?;
            let inbox = self.pending.entry(a.clone()).or_default();
            for i in 0..n {
                inbox.push(map.get_notification_bytes(&a, i)?);
            }
            count += n;
        }
        Ok(count)
    }

    /// Removes and returns the first message from `from` that `matches`.
    pub fn take(&mut self, from: &str, matches: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let inbox = self.pending.get_mut(from)?;
        let pos = inbox.iter().position(|m| matches(m))?;
        Some(inbox.remove(pos))
    }

    /// Waits until a notification equal to `tag` arrives from `from`.
    pub fn wait_for(
        &mut self,
        agent: &Agent,
        from: &str,
        tag: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.wait_matching(agent, from, |m| m == tag, timeout)
            .map(|_| ())
            .map_err(|e| {
                e.context(format!(
                    "waiting for notification {:?} from {from}",
                    String::from_utf8_lossy(tag)
                ))
            })
    }

    /// Waits until a notification from `from` satisfies `matches` (e.g. a
    /// prefix test), returning it.
    pub fn wait_matching(
        &mut self,
        agent: &Agent,
        from: &str,
        matches: impl Fn(&[u8]) -> bool,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        poll(
            timeout,
            Pace::Yield,
            || {
                if let Some(m) = self.take(from, &matches) {
                    return Ok(Some(m));
                }
                self.poll(agent)?;
                Ok(self.take(from, &matches))
            },
            |waited| {
                anyhow::anyhow!(
                    "none arrived within {waited:?}: {from} is not running, not connected, or frozen"
                )
            },
        )
    }
}
