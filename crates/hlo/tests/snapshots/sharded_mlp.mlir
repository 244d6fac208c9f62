module @sharded_mlp {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%arg0: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg1: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg2: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}) -> (tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, tensor<8x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>}) {
    %3 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
    %4 = sdy.sharding_constraint %3 <@mesh, [{"data"}, {"model"}]> : tensor<8x32xf32>
    %5 = stablehlo.logistic %4 : tensor<8x32xf32>
    %6 = stablehlo.dot_general %5, %arg2, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<8x32xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
    return %6, %5 : tensor<8x16xf32>, tensor<8x32xf32>
  }
}
