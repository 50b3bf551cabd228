import java.util.*;
import java.util.concurrent.*;
// 4 threads each build a HashMap of N entries (String -> byte[200]), then do random reads
// and some replacements; prints a digest of every map.
public class Gc {
    public static void main(String[] a) throws Exception {
        int n = Integer.parseInt(a[0]), reads = Integer.parseInt(a[1]), T = 4;
        ExecutorService ex = Executors.newFixedThreadPool(T);
        List<Future<Long>> fs = new ArrayList<>();
        for (int t = 0; t < T; t++) {
            final int tt = t;
            fs.add(ex.submit(() -> {
                HashMap<String, byte[]> m = new HashMap<>();
                Random r = new Random(tt);
                for (int i = 0; i < n; i++) {
                    byte[] v = new byte[200]; r.nextBytes(v); v[0] = (byte) i;
                    m.put("k" + tt + "_" + i, v);
                }
                long s = 0;
                for (int j = 0; j < reads; j++) {
                    int k = r.nextInt(n);
                    byte[] v = m.get("k" + tt + "_" + k);
                    s += v[j % 200];
                    if (j % 10 == 0) { byte[] w = v.clone(); w[1]++; m.put("k" + tt + "_" + k, w); }
                }
                for (int i = 0; i < n; i += 7) s = s * 31 + m.get("k" + tt + "_" + i)[1];
                return s;
            }));
        }
        long d = 0;
        for (Future<Long> f : fs) d = d * 1_000_003 + f.get();
        ex.shutdown();
        System.out.println(d);
    }
}
