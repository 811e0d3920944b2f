// rlock — Redis distributed locks for C++17. The umbrella header: include this.
#pragma once

#include "rlock/client.hpp"
#include "rlock/count_down_latch.hpp"
#include "rlock/errors.hpp"
#include "rlock/fair_lock.hpp"
#include "rlock/hold.hpp"
#include "rlock/inspect.hpp"
#include "rlock/lock_info.hpp"
#include "rlock/multi_lock.hpp"
#include "rlock/mutex.hpp"
#include "rlock/options.hpp"
#include "rlock/permit_expirable_semaphore.hpp"
#include "rlock/read_write_lock.hpp"
#include "rlock/red_lock.hpp"
#include "rlock/reentrant_lock.hpp"
#include "rlock/semaphore.hpp"
#include "rlock/version.hpp"
