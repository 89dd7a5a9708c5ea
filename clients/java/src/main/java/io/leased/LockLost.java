package io.leased;

import java.util.Map;

/**
 * Why a hold ended without its holder: the daemon's {@code lock_lost} (or
 * {@code sem_lost}) event, or {@code connection_closed} when the session
 * went with its connection.
 */
public record LockLost(String key, String token, String reason, Map<String, Object> event) {}
