//! The requests the `vhost` crate dispatches (`VhostUserBackendReqHandlerMut`), answered on
//! the session's state. What the crate does not dispatch is taken in `run`.

use super::session::{io_err, Region, SessionError, Vring};
use super::{Session, MAX_GRANTS};
use crate::features::{VHOST_F_LOG_ALL, VIRTIO_F_RING_PACKED};
use std::fs::File;
use std::sync::Arc;
use tracing::{debug, info};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut,
    VhostUserProtocolFeatures,
};
use virtq::RingAddrs;
use virtq::{DirtyLog, Iotlb};

fn invalid(what: &'static str) -> VuError {
    VuError::InvalidOperation(what)
}

impl VhostUserBackendReqHandlerMut for Session {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.stop_all();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.stop_all();
        for v in &mut self.vrings {
            *v = Vring::default();
        }
        self.acked = 0;
        self.iotlb = Iotlb::new(MAX_GRANTS);
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.cfg.offered())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        let offered = self.cfg.offered();
        if features & !offered != 0 {
            return Err(self.refuse(SessionError::UnofferedFeatures {
                acked: features,
                offered,
            }));
        }
        let was = self.acked;
        self.acked = features;
        info!(
            port = self.port,
            features = format_args!("{features:#x}"),
            "features acked"
        );
        // Live migration starts (or ends): the queues switch to a table that marks (or not)
        // every page they write, before the frontend hears back.
        if (was ^ features) & VHOST_F_LOG_ALL != 0 {
            let on = features & VHOST_F_LOG_ALL != 0;
            info!(
                port = self.port,
                on,
                log_mapped = self.dirty.is_some(),
                pages_marked = self.dirty.as_ref().map_or(0, |d| d.marked()),
                "dirty logging (live migration)"
            );
            self.publish(true)?;
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<u64>>> {
        self.regions = ctx
            .iter()
            .zip(files)
            .map(|(r, file)| Region {
                gpa: r.guest_phys_addr,
                len: r.memory_size,
                uaddr: r.user_addr,
                mmap_offset: r.mmap_offset,
                file,
                adds: 1,
            })
            .collect();
        self.remap()?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        let max = u32::from(self.cfg.max_queue_size);
        self.vring(index)?;
        // 0 is accepted and leaves the ring unable to start: DPDK virtio-user sends
        // SET_VRING_NUM 0 (then its address and kick) for queues of its device that the
        // application did not set up (e.g. `queues=2` with one testpmd queue); DPDK's vhost
        // library accepts that (0 passes its power-of-two check), refusing it ends the session.
        if num > max || (num != 0 && !num.is_power_of_two()) {
            return Err(self.refuse(SessionError::BadQueueSize { index, num, max }));
        }
        let num = self.fits_u16("queue size", num)?;
        self.vring(index)?.num = num;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let v = self.vring(index)?;
        v.addrs = Some(RingAddrs {
            desc: descriptor,
            avail: available,
            used,
        });
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        // Packed ring: bits 0-14 the next avail slot, bit 15 its wrap counter; QEMU adds the
        // used slot and wrap in bits 16-31. pvnet's device restarts with every buffer before
        // the base returned (it completes or gives back every chain before it stops), so the
        // used half equals the avail half and only the avail half is kept (as DPDK does).
        let base = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            (base & 0xffff) as u16
        } else {
            self.fits_u16("ring base", base)?
        };
        self.vring(index)?.base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        let i = self.fits_u16("queue index", index)?;
        let base = self.stop(i)?;
        // The ring is stopped; a new SET_VRING_KICK starts it again.
        self.vring(index)?.kick = None;
        // Packed ring: the used half (bits 16-31, QEMU reads it) is the avail half: every
        // buffer before the base has been returned.
        let num = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            u32::from(base) | u32::from(base) << 16
        } else {
            u32::from(base)
        };
        Ok(VhostUserVringState::new(index, num))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = u16::from(index);
        self.stop(i)?;
        self.vring(u32::from(index))?.kick = Some(fd);
        self.maybe_start(i)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = u16::from(index);
        let was_running = self.vring(u32::from(index))?.running;
        // Swap the fd with the ring stopped, then resume where it was.
        self.stop(i)?;
        self.vring(u32::from(index))?.call = fd;
        if was_running {
            self.maybe_start(i)?;
        }
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.err = fd;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        // BACKEND_REQ carries the IOTLB misses; QEMU requires it and REPLY_ACK for an IOMMU.
        // LOG_SHMFD: the dirty log of live migration; RARP: the destination announces the
        // guest's address (`SEND_RARP`) so the switch relearns where it is. MTU: the frontend
        // tells the MTU it gave the guest (`NET_SET_MTU`), and hears a refusal.
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::RARP
            | VhostUserProtocolFeatures::MTU)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.protocol = features;
        info!(
            port = self.port,
            protocol = format_args!("{features:#x}"),
            "protocol features acked"
        );
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(u64::from(self.cfg.queue_pairs))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        let i = self.fits_u16("queue index", index)?;
        if enable {
            self.vring(index)?.enabled = true;
            self.maybe_start(i)
        } else {
            self.stop(i)?;
            self.vring(index)?.enabled = false;
            Ok(())
        }
    }

    fn get_config(&mut self, _o: u32, _s: u32, _f: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        Err(invalid("GET_CONFIG not offered"))
    }

    fn set_config(&mut self, _o: u32, _b: &[u8], _f: VhostUserConfigFlags) -> VuResult<()> {
        Err(invalid("SET_CONFIG not offered"))
    }

    fn set_gpu_socket(&mut self, _g: GpuBackend) -> VuResult<()> {
        Err(invalid("not a GPU device"))
    }

    fn get_shared_object(&mut self, _u: VhostUserSharedMsg) -> VuResult<File> {
        Err(invalid("shared objects not offered"))
    }

    fn get_inflight_fd(&mut self, _i: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        Err(invalid("inflight fd not offered"))
    }

    fn set_inflight_fd(&mut self, _i: &VhostUserInflight, _f: File) -> VuResult<()> {
        Err(invalid("inflight fd not offered"))
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(self.cfg.mem_slots)
    }

    fn add_mem_region(
        &mut self,
        r: &VhostUserSingleMemoryRegion,
        file: File,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<u64>> {
        if let Some(x) = self.regions.iter_mut().find(|x| x.same(r)) {
            x.adds += 1;
            debug!(
                port = self.port,
                gpa = format_args!("{:#x}", { r.guest_phys_addr }),
                adds = x.adds,
                "region added again (one vhost device per queue pair): kept as it is"
            );
            return Ok(None);
        }
        if self.regions.len() as u64 >= self.cfg.mem_slots {
            return Err(self.refuse(SessionError::TooManyRegions {
                max: self.cfg.mem_slots,
            }));
        }
        self.regions.push(Region {
            gpa: r.guest_phys_addr,
            len: r.memory_size,
            uaddr: r.user_addr,
            mmap_offset: r.mmap_offset,
            file,
            adds: 1,
        });
        if let Err(e) = self.remap() {
            self.regions.pop();
            return Err(e);
        }
        Ok(None)
    }

    fn remove_mem_region(&mut self, r: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        // A region added more than once goes when its last add is removed.
        if let Some(x) = self
            .regions
            .iter_mut()
            .find(|x| x.gpa == r.guest_phys_addr && x.len == r.memory_size && x.adds > 1)
        {
            x.adds -= 1;
            return Ok(());
        }
        let before = self.regions.len();
        self.regions
            .retain(|x| !(x.gpa == r.guest_phys_addr && x.len == r.memory_size));
        if self.regions.len() == before {
            return Err(self.refuse(SessionError::NoSuchRegion {
                gpa: r.guest_phys_addr,
                len: r.memory_size,
            }));
        }
        if self.regions.is_empty() {
            self.mem = None;
            return Ok(());
        }
        self.remap()
    }

    fn set_device_state_fd(
        &mut self,
        _d: VhostTransferStateDirection,
        _p: VhostTransferStatePhase,
        _f: File,
    ) -> VuResult<Option<File>> {
        Err(invalid("device state transfer not offered"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        Err(invalid("device state transfer not offered"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        Err(invalid("shared memory regions not offered"))
    }

    /// The dirty log: `mmap_size` bytes of bitmap at `mmap_offset` of the fd (one bit per
    /// 4 KiB guest page, `VHOST_USER_PROTOCOL_F_LOG_SHMFD`). A new one replaces the old (QEMU
    /// resizes it with the guest's memory); the queues switch to it before the reply.
    fn set_log_base(&mut self, l: &VhostUserLog, f: File) -> VuResult<()> {
        let base = self
            .base
            .clone()
            .ok_or(invalid("SET_LOG_BASE before the memory table"))?;
        let len = usize::try_from(l.mmap_size).map_err(|_| invalid("dirty log too large"))?;
        let m = crate::mmap::Mapping::new(f, l.mmap_offset, l.mmap_size).map_err(io_err)?;
        let start = m.start();
        // SAFETY: `start .. start + len` is the mapping just made, kept alive by the log.
        let log = unsafe { DirtyLog::new(start, len, base.shared_ranges(), Arc::new(m)) };
        info!(
            port = self.port,
            bytes = len,
            covers_gib = len as f64 * 8.0 * 4096.0 / f64::from(1u32 << 30),
            "dirty log mapped"
        );
        self.dirty = Some(Arc::new(log));
        if self.acked & VHOST_F_LOG_ALL != 0 {
            self.publish(true)?;
        }
        Ok(())
    }
}
