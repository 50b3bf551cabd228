// A HashMap of N entries (N from the command line), 10 M random gets, then a SHA-256 of the
// values in key order: a heap about twice a 288 MiB budget, read at random, and a collector
// that walks it. Prints the size, a sum of the gets and the digest, to compare runs.
import java.util.*;
import java.security.MessageDigest;
public class HashMapGets {
  public static void main(String[] a) throws Exception {
    int N = Integer.parseInt(a[0]);
    Random r = new Random(7);
    HashMap<Long, long[]> m = new HashMap<>();
    for (int i = 0; i < N; i++) { long k = r.nextLong() % 1000000000L; m.put(k, new long[]{k, i, k * 31, i ^ 0x5555}); }
    long acc = 0;
    for (int i = 0; i < 10000000; i++) { long[] v = m.get(r.nextLong() % 1000000000L); if (v != null) acc += v[1]; long[] w = m.get((long) r.nextInt(N)); }
    // deterministic hash: sorted keys
    long[] keys = new long[m.size()]; int j = 0; for (Long k : m.keySet()) keys[j++] = k; Arrays.sort(keys);
    MessageDigest md = MessageDigest.getInstance("SHA-256");
    java.nio.ByteBuffer bb = java.nio.ByteBuffer.allocate(32);
    for (long k : keys) { long[] v = m.get(k); bb.clear(); for (long x : v) bb.putLong(x); md.update(bb.array()); }
    StringBuilder sb = new StringBuilder(); for (byte b : md.digest()) sb.append(String.format("%02x", b));
    System.out.println(m.size() + " " + acc + " " + sb);
  }
}
