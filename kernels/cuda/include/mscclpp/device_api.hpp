// Everything a user kernel needs: #include <mscclpp/device_api.hpp>.
#ifndef MSCCLPP_DEVICE_API_HPP_
#define MSCCLPP_DEVICE_API_HPP_

#include "copy_device.hpp"
#include "device.hpp"
#include "fifo_device.hpp"
#include "memory_channel_device.hpp"
#include "packet_device.hpp"
#include "port_channel_device.hpp"
#include "semaphore_device.hpp"
#include "switch_channel_device.hpp"

#endif  // MSCCLPP_DEVICE_API_HPP_
